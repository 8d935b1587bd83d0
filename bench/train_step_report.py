"""The report's sections for bench/train_step.py: case 2 (a train step, and
where its CPU goes) and case 8 (autotune's choice beside a sweep), with their
progress headlines."""
import os

from .report_format import IDLE_MODE, NORMAL_MODE, TARGETS, case_failed, fmt_bytes, load_str, ms, ratio, table
from .report_plots import bars


def train_section(case, img):
    out = ["## 2. Training step: %s x Linear(%s, %s)\n" % (case.get("layers", 6), case.get("width", 2048),
                                                           case.get("width", 2048))]
    f = case_failed(case)
    if f:
        return "\n".join(out + [f])
    mo = case["modes"]
    out.append("%d x Linear(%d, %d) (%.1f M parameters, %.0f MB of float32 gradients), batch %d per rank, "
               "%d ranks, %d compute thread per rank, SGD; %d rounds x %d steps per mode, interleaved. "
               "\"no communication\" is the same step with a plain optimizer: what perfect overlap "
               "would reach. Load %s.\n"
               % (case["layers"], case["width"], case["width"], case.get("params", 0) / 1e6,
                  case.get("params", 0) * 4 / 1e6, case["batch_per_rank"], case["ranks"],
                  case.get("threads_per_rank", 1), case["rounds"], case["steps_per_round"], load_str(case)))
    cpu = any("other_threads_cpu_ms" in v for v in mo.values())
    rows = [[k, ms(v["median_ms"]), ms(v["min_ms"]), ms(v["max_ms"]), ratio(v["ratio_to_nocomm"])] +
            ([ms(v.get("train_thread_cpu_ms")), ms(v.get("other_threads_cpu_ms"))] if cpu else [])
            for k, v in mo.items()]
    rows += [[k, "absent", "", "", why] + (["", ""] if cpu else []) for k, why in case.get("absent", {}).items()]
    out.append(table(["mode", "median ms", "min", "max", "x no-comm"] +
                     (["training thread CPU ms/step", "other threads CPU ms/step"] if cpu else []), rows))
    out.append(cpu_analysis(case))
    out.append("\n" + img("bench_train_step.png", bars, mo, "train step, %d ranks" % case["ranks"],
                          "ms per step (median; min-max)", list(case.get("absent", {}))))
    return "\n".join(out)


def cpu_analysis(case):
    """What bounds the overlapped step: the CPU the reduction itself needs."""
    mo = case["modes"]
    base, hv = mo.get("no communication"), mo.get("hvdlite")
    if not base or not hv or "other_threads_cpu_ms" not in hv:
        return ""
    cpus = case.get("cpus") or os.cpu_count() or 1
    threads = case["ranks"] * case.get("threads_per_rank", 1)
    gb = case.get("params", 0) * 4 / 1e9
    eng = hv["other_threads_cpu_ms"]
    bound = (hv["train_thread_cpu_ms"] + eng) / base["median_ms"]
    need = (TARGETS["train_step"] - 1) * base["median_ms"]
    text = ("\n**What bounds the step.** CPU times are per rank and step: the training thread's, "
            "and that of the process's other threads (hvdlite's engine, Horovod's background "
            "thread, gloo's workers), which is what communication costs the cores. With %d ranks x %d compute thread on %d cores, the "
            "training threads already take every core, so the engine's work cannot run beside them "
            "for free: the training thread used %s ms with hvdlite against %s ms without "
            "communication (overlap hides the rest), and the engine %s ms to reduce "
            "%.0f MB, %.1f GB/s per rank. Training-thread CPU plus engine CPU, over the "
            "no-communication step, is %.2fx: the floor on this hardware, against %.2fx measured. "
            "The %.2fx target leaves %.1f ms per step for the reduction, %.1f GB/s per rank."
            % (case["ranks"], case.get("threads_per_rank", 1), cpus,
               ms(hv["train_thread_cpu_ms"]), ms(base.get("train_thread_cpu_ms")), ms(eng), gb * 1e3,
               gb / (eng / 1e3) if eng else float("nan"), bound, hv["ratio_to_nocomm"],
               TARGETS["train_step"], need, gb / (need / 1e3) if need > 0 else float("nan")))
    if threads < cpus:
        text += " Here cores were left over, so the engine could also run beside the training threads."
    if case.get("allocator") == "keep":
        text += (" Every mode ran with glibc told to keep freed blocks up to 32 MB for reuse "
                 "(`bench/train_step.py --allocator keep`, the default): with glibc's own thresholds "
                 "a step may return its freed 16 MB gradients to the kernel and fault them in again "
                 "in the next backward, ~25k page faults and 20-30 ms of the training thread, in "
                 "some modes of a run and not others (docs/torch.md). The faults column of the "
                 "script's table shows it.")
    normal = mo.get(NORMAL_MODE)
    if normal and "other_threads_cpu_ms" in normal:
        text += ("\n\nThe default engine priority, `auto`, ran the engine at idle priority here (the "
                 "job is on one host and its compute threads fill the cores); forced to `normal` "
                 "the engine took %s ms of CPU per step (training thread %s ms), %.2fx the "
                 "no-communication step. An idle-priority engine runs when a core has nothing else "
                 "to run (after backward, or on the core of a rank that finished first), in long "
                 "stretches, instead of waking in the middle of backward for every negotiation "
                 "round and every chunk a peer publishes (docs/engine.md)."
                 % (ms(normal["other_threads_cpu_ms"]), ms(normal.get("train_thread_cpu_ms")),
                    normal["ratio_to_nocomm"]))
    idle = mo.get(IDLE_MODE)
    if idle and "other_threads_cpu_ms" in idle:
        text += ("\n\nThe same reduction took the engine %s ms of CPU per step with "
                 "`HVDLITE_ENGINE_PRIORITY=idle` (training thread %s ms), %.2fx the no-communication "
                 "step: an idle-priority engine runs when a core has nothing else to run (after "
                 "backward, or on the core of a rank that finished first), in long stretches, instead "
                 "of waking in the middle of backward for every negotiation round and every chunk a "
                 "peer publishes. Use it where the training threads fill every core and nothing else "
                 "runs on the host: an idle-priority thread gets almost no CPU while other programs "
                 "keep the cores busy (docs/engine.md)."
                 % (ms(idle["other_threads_cpu_ms"]), ms(idle.get("train_thread_cpu_ms")),
                    idle["ratio_to_nocomm"]))
    return text + "\n"


def autotune_section(case):
    L = ["## Case 8: autotune against a sweep\n"]
    failed = case_failed(case)
    if failed:
        return "\n".join(L + [failed])
    a = case["autotune"]
    where = ("%s emulated hosts x ranks at %s" % (case["layout"], case["rate"])) if case.get("layout") else \
        "%d ranks on one host" % case["ranks"]
    L.append("The train step of case 2 (%s). First a tuning phase: hvdlite trains with "
             "`HVDLITE_AUTOTUNE=1` (samples of %s steps) until its search ends: %d samples in %d steps, "
             "%.1f s. Then its choice runs as one more mode, interleaved with a sweep of fixed settings "
             "(median of %d rounds x %d steps):\n"
             % (where, a["log"][1]["steps"] if len(a["log"]) > 1 else "?", a["samples"], a["steps"],
                a["seconds"], case["rounds"], case["steps_per_round"]))
    rows = [[name, ms(m["median_ms"]), ms(m["p25_ms"]), ms(m["p75_ms"]), ratio(m["ratio_to_nocomm"])]
            for name, m in case["modes"].items()]
    L.append(table(["mode", "median ms", "p25", "p75", "x no-comm"], rows))
    L.append("\nAutotune chose fusion %s, cycle %g ms: **%s** the step time of the best fixed setting "
             "(%s).\n" % (fmt_bytes(a["fusion_threshold_bytes"]), a["cycle_time_ms"],
                          ratio(a["ratio_to_best_of_sweep"]), a["best_of_sweep"]))
    return "\n".join(L) + "\n"


def train_headline(res):
    m = res["modes"]
    return ", ".join("%s %s ms (%s)" % (k, ms(v["median_ms"]), ratio(v["ratio_to_nocomm"]))
                     for k, v in m.items())


def autotune_headline(res):
    a = res["autotune"]
    return "chose fusion %s cycle %g ms in %d steps: %s the best of the sweep (%s)" % (
        fmt_bytes(a["fusion_threshold_bytes"]), a["cycle_time_ms"], a["steps"],
        ratio(a["ratio_to_best_of_sweep"]), a["best_of_sweep"])
