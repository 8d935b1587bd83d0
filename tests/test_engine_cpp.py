"""MPI-free C++ unit tests of engine parts (tests/cpp/): the response cache,
message serialization, the coordinator's decisions (Controller's
Coordinate and Decide), the shared-memory slots' stores, the engine
thread's placement trial, and the allreduce pipeline with each bucket
strategy and the compressors on the wire, over an in-process fake transport
(tests/cpp/fake_transport.h: ranks are threads), the setup agreement
helpers, abandoning an engine (hvd_abandon) on one rank, and the socket
ring's connection to a neighbour's first answering address. Each program is
built against the engine's objects by tests/harness/cpp_build.py and prints
one line per test and a failure count."""
import pytest

from harness import cpp_build

PROGRAMS = ["test_response_cache", "test_message", "test_controller", "test_reduce_kernels",
            "test_bucket_planner", "test_request_validation", "test_shm_stores", "test_affinity_trial",
            "test_allreduce_pipeline", "test_rank_agreement", "test_flight_recorder", "test_abandon",
            "test_socket_connect"]


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """The programs this session selected, built together (cpp_build.build)."""
    selected = [item.callspec.params["program"] for item in request.session.items
                if item.module is request.module]
    return cpp_build.build(selected, tmp_path_factory.mktemp("engine_cpp"))


@pytest.mark.parametrize("program", PROGRAMS)
def test_engine_unit(program, built, tmp_path):
    print(cpp_build.run(program, built[program], tmp_path))
