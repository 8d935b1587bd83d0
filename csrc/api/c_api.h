/* The only surface of the engine that the front ends see: the Python binding
   (cffi) and the TensorFlow op library. Plain C types; every call is safe
   from any thread. The codes below are the engine's own (csrc/common/common.h;
   api/codes.cc checks that they agree), so front ends read them from here
   instead of copying them. Functions that can fail return a negative value
   (or NULL) and leave a message in hvd_last_error(). */
#ifndef HVDLITE_C_API_H_
#define HVDLITE_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Collective kinds (OpType). */
enum hvd_op_type {
  HVD_OP_ALLREDUCE = 0,
  HVD_OP_ALLGATHER = 1,
  HVD_OP_BROADCAST = 2,
  HVD_OP_ALLTOALL = 3,
  HVD_OP_REDUCESCATTER = 4,
  HVD_OP_BARRIER = 5,
  HVD_OP_ADD_PROCESS_SET = 6,
  HVD_OP_REMOVE_PROCESS_SET = 7,
  HVD_OP_JOIN = 8
};

/* Element types (DataType); the name after HVD_DTYPE_ is the front ends'
   dtype name in lower case. */
enum hvd_data_type {
  HVD_DTYPE_UINT8 = 0,
  HVD_DTYPE_INT8 = 1,
  HVD_DTYPE_INT32 = 2,
  HVD_DTYPE_INT64 = 3,
  HVD_DTYPE_FLOAT16 = 4,
  HVD_DTYPE_FLOAT32 = 5,
  HVD_DTYPE_FLOAT64 = 6,
  HVD_DTYPE_BFLOAT16 = 7,
  HVD_DTYPE_BOOL = 8,
  HVD_DTYPE_UINT16 = 9,
  HVD_DTYPE_INT16 = 10
};

/* Reduce ops (ReduceOp). Adasum: floating-point allreduce only, on a
   power-of-2 number of ranks. */
enum hvd_reduce_op {
  HVD_REDUCE_AVERAGE = 0,
  HVD_REDUCE_SUM = 1,
  HVD_REDUCE_MIN = 2,
  HVD_REDUCE_MAX = 3,
  HVD_REDUCE_PRODUCT = 4,
  HVD_REDUCE_ADASUM = 5
};

/* Compressors (CompressionType); hvd_compression_code() finds one by name. */
enum hvd_compression_type {
  HVD_COMPRESSION_NONE = 0,
  HVD_COMPRESSION_FP16 = 1,
  HVD_COMPRESSION_TOPK = 2,
  HVD_COMPRESSION_BF16 = 3,
  HVD_COMPRESSION_POWERSGD = 4,
  HVD_COMPRESSION_QUANTIZE = 5
};

/* Why a call or a handle failed (ErrorKind). */
enum hvd_error_kind {
  HVD_ERROR_NONE = 0,
  HVD_ERROR_INVALID_ARGUMENT = 1, /* bad input detected on this rank */
  HVD_ERROR_MISMATCH = 2,         /* ranks disagree on a tensor's metadata */
  HVD_ERROR_SHUTDOWN = 3,         /* the engine stopped (shutdown or a rank left) */
  HVD_ERROR_MPI = 4,              /* an MPI call failed */
  HVD_ERROR_STALL = 5,            /* the stall inspector gave up waiting */
  HVD_ERROR_INTERNAL = 6,
  HVD_ERROR_NOT_INITIALIZED = 7,  /* no engine: init() not called, or shutdown() was */
  HVD_ERROR_TIMEOUT = 8           /* a peer did not answer in time (dead or hung rank) */
};

typedef struct hvd_tensor_request {
  int32_t op;             /* OpType */
  const char* name;       /* NULL or "" for an automatic name */
  int32_t dtype;          /* DataType */
  int32_t ndim;
  const int64_t* shape;
  const void* input;
  void* output;           /* allreduce, broadcast: caller-owned; allgather, reducescatter,
                             alltoall: caller-owned with output_bytes, or NULL; others: NULL */
  int32_t reduce_op;      /* ReduceOp */
  double prescale;
  double postscale;
  int32_t root_rank;
  const int64_t* splits;  /* alltoall: rows sent to each rank; NULL: equal parts */
  int32_t nsplits;
  const int32_t* set_ranks;  /* add process set: the new set's ranks */
  int32_t nset_ranks;
  int32_t target_set;     /* remove process set: the id of the set to remove */
  int32_t compression;    /* CompressionType, with topk_ratio and error_feedback */
  double topk_ratio;
  int32_t error_feedback;
  int32_t compression_config;  /* 0, or an id from hvd_compression_config (then the
                                  three fields above are ignored) */
  int32_t process_set;
  int32_t device;         /* 1: input/output are device tensors; input is the front end's token */
  int32_t members_only;   /* add process set: 1 when only the new set's members submit it (each
                             with the same name); the others learn of the set from the engine */
  int64_t output_bytes;   /* allgather, reducescatter, alltoall of host tensors: the bytes of the
                             caller-owned `output` (0: none). The engine writes the result there
                             when it is exactly that long (the input may lie inside it), and
                             otherwise allocates it as without one */
} hvd_tensor_request;

/* comm: the Fortran handle of an MPI communicator (mpi4py's Comm.py2f()). */
int hvd_init(int64_t comm_fortran_handle);
/* Returns the ErrorKind the engine stopped with (0 if it was not running):
   kShutdown after a normal shutdown; kTimeout or kMpi when a peer stopped
   answering, in which case MPI_Finalize would wait for it forever. */
int hvd_shutdown(const char* reason);
/* Stops the engine on this rank alone: the recovery from a lost peer, after
   which the survivors start a new engine on a communicator of their own
   (docs/reliability.md, "Going on without a lost rank"). No message to any
   rank and no MPI call that could wait for one: the old engine's
   communicators and requests are left to MPI_Finalize, its shared memory is
   unmapped. Every pending handle fails with HVD_ERROR_SHUTDOWN and a message
   that holds `reason`, and so does every call until the next hvd_init, which
   starts a new engine; the old handles stay readable until then. Waits up to
   grace_seconds for the engine thread: returns 0 once it stopped, or
   -HVD_ERROR_TIMEOUT when it is stuck in an MPI call (the process must then
   be restarted: hvd_init refuses). Any thread, also while others wait on
   handles; safe to call again (the first reason stays); 0 when no engine
   runs. */
int hvd_abandon(const char* reason, double grace_seconds);
int hvd_is_initialized(void);
const char* hvd_last_error(void);
int hvd_last_error_kind(void);

int hvd_rank(void);
int hvd_size(void);
int hvd_local_rank(void);
int hvd_local_size(void);
int hvd_cross_rank(void);
int hvd_cross_size(void);
int hvd_mpi_threads_supported(void);
int hvd_mpi_library_version(char* buffer, int length);

/* Returns a handle > 0, or the negated ErrorKind. */
int64_t hvd_enqueue(const hvd_tensor_request* request);
/* hvd_enqueue of an allreduce with its fields as arguments: the per-gradient
   path, where filling a struct field by field from Python costs more than
   the engine's own work. */
int64_t hvd_enqueue_allreduce(const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                              const void* input, void* output, int32_t reduce_op, double prescale,
                              double postscale, int32_t compression, double topk_ratio,
                              int32_t error_feedback, int32_t compression_config,
                              int32_t process_set);
/* 1 completed, 0 pending, -1 unknown handle. */
int hvd_poll(int64_t handle);
/* 1 completed, 0 timed out, -1 unknown handle; timeout < 0 waits forever. */
int hvd_wait(int64_t handle, double timeout_seconds);
/* hvd_wait, then on success also hvd_release: 0 still pending, 1 succeeded
   (handle released), 2 failed (handle kept so its error can be read), -1 on
   an unknown handle. One call per tensor on the common path. */
int hvd_wait_release(int64_t handle, double timeout_seconds);
/* Completion notification, for front ends whose threads must not block
   (TensorFlow's asynchronous kernels): callback(handle, arg) runs exactly
   once when the handle completes, successfully or not. It runs on the engine
   thread, or on the calling thread at once if the handle has completed
   already. It must return quickly and must not call into hvdlite: it should
   only hand the handle to a thread of its own, which then reads the outcome
   (hvd_handle_error, hvd_handle_take_output, ...) and releases the handle.
   Returns 0, or -1 for an unknown handle. */
typedef void (*hvd_completion_callback)(int64_t handle, void* arg);
int hvd_on_completion(int64_t handle, hvd_completion_callback callback, void* arg);
/* ErrorKind of a completed handle (0 = success); the message goes to buffer. */
int hvd_handle_error(int64_t handle, char* buffer, int64_t length);
/* Engine-allocated result: ownership passes to the caller (free with
   hvd_free_output). A result the engine wrote into the caller's output
   (hvd_tensor_request.output_bytes) has no data here (NULL, 0 bytes), its
   shape as usual. Returns ndim, or -1. */
int hvd_handle_take_output(int64_t handle, void** data, int64_t* nbytes, int64_t* shape,
                           int32_t max_dims);
int hvd_handle_received_splits(int64_t handle, int64_t* splits, int32_t count);
int64_t hvd_handle_value(int64_t handle);
void hvd_release(int64_t handle);
void hvd_free_output(void* data);

/* Device tensors (device_jobs.h). A front end that runs device collectives
   enables the path with its backend's name ("nccl", "gloo"), then one thread
   of it takes jobs and reports each done. hvd_device_next_job returns a
   JSON description (free it with hvd_free_output) and sets *status to 1,
   or returns NULL with *status 0 (nothing within the timeout) or -1 (the
   engine stopped). hvd_device_job_done: error_kind 0 for success, else the
   ErrorKind to fail the job's handles with; returns 0, or -1 for an unknown
   job (already failed because the engine stopped). */
int hvd_device_enable(const char* backend);
char* hvd_device_next_job(double timeout_seconds, int* status);
int hvd_device_job_done(int64_t job_id, int error_kind, const char* message);

/* Process sets: ids, and the engine ranks of a set. */
int hvd_process_set_ids(int32_t* ids, int32_t capacity);
int hvd_process_set_ranks(int32_t id, int32_t* ranks, int32_t capacity);
int hvd_process_set_rank(int32_t id);
int hvd_process_set_size(int32_t id);

/* Engine counters, in the order of hvd_engine_stats_names() (comma-separated).
   Returns how many values exist. */
int hvd_engine_stats(int64_t* values, int32_t capacity);
const char* hvd_engine_stats_names(void);
/* The code of the compressor called `name` ("none", "fp16", "topk", ...), -1 if none is. */
int32_t hvd_compression_code(const char* name);
/* A compressor with options (top-k's momentum correction, warm-up and
   clipping; PowerSGD's rank and start; the quantizer's bits, block size,
   rounding and seed): registered once per process, then named by the
   returned id (>= 1) in a request's `compression_config` field, as process
   sets are named by theirs. The same arguments give the same id. Returns the
   negated ErrorKind when the kind or an argument is invalid. */
int32_t hvd_compression_config(int32_t kind, double topk_ratio, int32_t error_feedback, double momentum,
                               int64_t warmup_steps, double clip_norm, int32_t rank, int64_t start_iter,
                               int32_t bits, int64_t block_size, int32_t stochastic, int64_t seed);
int hvd_reset_compression_state(void);
/* Top-k's k for a tensor of `count` elements at `ratio`: tensors of fewer
   than 1024 elements are sent whole, others keep ceil(ratio * count)
   elements (at least 1, at most count). Front ends that run top-k
   themselves (the torch device executor) use it to match the engine. */
int64_t hvd_topk_count(int64_t count, double ratio);
/* The framework's compute (intra-op) threads per rank, reported by its
   adapter; HVDLITE_ENGINE_PRIORITY=auto decides from it. 0: unknown. */
int hvd_set_compute_threads(int32_t threads);
/* Timeline: "%r" in the path becomes the rank; without it only rank 0 writes. */
int hvd_start_timeline(const char* path, int mark_cycles);
int hvd_stop_timeline(void);
/* Flight recorder: the engine's recent events as JSON lines (a header line,
   then one line per event, oldest first), also after the engine stopped.
   Writes at most length - 1 bytes and a NUL; returns the full text's length
   (call again with a larger buffer when it is >= length), or the negated
   ErrorKind. */
int64_t hvd_flight_recorder_json(char* buffer, int64_t length);

#ifdef __cplusplus
}
#endif

#endif /* HVDLITE_C_API_H_ */
