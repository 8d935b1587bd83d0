"""Formatting shared by the report's sections (bench/report.py assembles the
document): numbers as the tables print them, Markdown tables, the targets."""
import math


R50_RAW = ["mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets"]


IDLE_MODE = "hvdlite, engine priority idle"      # runs from before auto was the default


NORMAL_MODE = "hvdlite, engine priority normal"


TARGETS = {"resnet50": 1.10, "train_step": 1.15, "small": 2.0, "net_topk": 10.0, "net_fp16": 1.8}


RESNET50_FLOATS = 25557032


def ms(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x < 1:
        return "%.3f" % x
    if x < 10:
        return "%.2f" % x
    if x < 100:
        return "%.1f" % x
    return "%.0f" % x


def ratio(x):
    return "-" if x is None else "%.2fx" % x


def table(headers, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def best_of(results, names):
    names = [n for n in names if n in results]
    if not names:
        return None
    return min(names, key=lambda n: results[n]["median_ms"])


def met(value, limit, higher_is_better=False):
    if value is None:
        return "not measured"
    ok = value >= limit if higher_is_better else value <= limit
    return "**met**" if ok else "**not met**"


def fmt_bytes(b):
    b = int(b)
    if b == 0:
        return "0"
    if b % (1 << 20) == 0:
        return "%d MB" % (b >> 20)
    if b % 1024 == 0:
        return "%d KB" % (b >> 10)
    return "%d B" % b


def load_str(case):
    la = case.get("_loadavg") if isinstance(case, dict) else None
    if not la:
        return "?"
    return "%s -> %s" % (la["start"][0] if la.get("start") else "?", la["end"][0] if la.get("end") else "?")


def ok(data, name):
    c = data["cases"].get(name)
    return c is not None and "error" not in c and "skipped" not in c


def case_failed(case):
    if "error" in case:
        return "**This case failed**; the error:\n\n```\n%s\n```\n" % case["error"][-1500:]
    if "skipped" in case:
        return "**Skipped**: %s\n" % case["skipped"]
    return None
