"""hvdrun's parts that need no MPI job: flags, hosts, hostfiles, SSH error texts,
MPI detection, the launch commands, output records.  Runs in about a second."""

import importlib
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from harness.checks import REQUIRE_ALL, unavailable
from harness.hosts import REPO, hvdrun_argv

try:
    import hvdlite.launcher as pkg
except ImportError:
    if REQUIRE_ALL:
        raise
    sys.path.insert(0, REPO)
    import launcher as pkg


def mod(name):
    return importlib.import_module("%s.%s" % (pkg.__name__, name))


hosts = mod("hosts")
options = mod("options")
ssh_check = mod("ssh_check")
mpi_detect = mod("mpi_detect")
mpi_command = mod("mpi_command")
output = mod("output")
rank_wrapper = mod("rank_wrapper")
job = mod("job")
main = mod("__main__").main


def parse_error(argv, capsys):
    """Run hvdrun's parser on argv; return its one-line error (exit code must be 2)."""
    with pytest.raises(SystemExit) as e:
        options.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdrun: error: "), err
    return err


# ---- -H and hostfiles ---------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("a", [("a", 1)]),
    ("a:2,b:2", [("a", 2), ("b", 2)]),
    ("node-1.example.com:8, 10.0.0.2:4", [("node-1.example.com", 8), ("10.0.0.2", 4)]),
    ("[fe80::1]:2,b", [("fe80::1", 2), ("b", 1)]),
])
def test_hosts_arg(text, expected):
    assert [(h.name, h.slots) for h in hosts.parse_hosts_arg(text)] == expected


@pytest.mark.parametrize("text,words", [
    ("a:x", "slots must be a positive integer"),
    ("a:0", "slots must be a positive integer"),
    ("a:-1", "slots must be a positive integer"),
    ("a:2,,b:2", "empty entry"),
    ("a:2:3", "expected HOST or HOST:SLOTS"),
    (":2", "not a valid host name"),
    ("a b:2", "not a valid host name"),
    ("a:2,a:2", "listed twice"),
    ("", "empty host list"),
])
def test_bad_hosts_arg_is_a_clear_usage_error(text, words, capsys):
    err = parse_error(["-H", text, "python", "x.py"], capsys)
    assert words in err


def test_hostfile_formats(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# a comment\n\nnode1 slots=4\nnode2:2   # Intel MPI / MPI operator style\n"
                 "node3\nnode4 slots=2 max_slots=8\n")
    assert [(h.name, h.slots) for h in hosts.parse_hostfile(str(f))] == \
        [("node1", 4), ("node2", 2), ("node3", 1), ("node4", 2)]


@pytest.mark.parametrize("content,words", [
    ("node1 slots=four\n", "line 1: slots must be a positive integer"),
    ("node1\nnode2 cpus=3\n", "line 2: unknown field 'cpus=3'"),
    ("# only comments\n\n", "lists no hosts"),
    ("node1 slots=2\nnode1 slots=2\n", "listed twice"),
])
def test_bad_hostfile(tmp_path, capsys, content, words):
    f = tmp_path / "hosts"
    f.write_text(content)
    assert words in parse_error(["--hostfile", str(f), "python", "x.py"], capsys)


def test_missing_hostfile(capsys):
    err = parse_error(["--hostfile", "/nonexistent/hosts.txt", "python", "x.py"], capsys)
    assert "hostfile /nonexistent/hosts.txt: no such file" in err


def test_np_larger_than_slots(capsys):
    err = parse_error(["-np", "5", "-H", "a:2,b:2", "python", "x.py"], capsys)
    assert "-np 5 is more than the 4 slots of -H (a:2,b:2)" in err


@pytest.mark.parametrize("argv,words", [
    (["-np", "2"], "no command given"),
    (["python", "x.py"], "-np is required"),
    (["-np", "0", "python"], "-np must be at least 1"),
    (["-np", "2", "-H", "a:2", "--hostfile", "f", "python"], "not both"),
    (["-np", "2", "-i", "/nonexistent/key", "-H", "a:2", "python"], "no such key file"),
    (["-np", "2", "--env", "1BAD=x", "python"], "not a valid variable name"),
    (["-np", "2", "--env", "HVDLITE_TEST_SURELY_UNSET", "python"], "is not set"),
    (["-np", "2", "--mpi-args", "'unclosed", "python"], "--mpi-args"),
    (["-np", "2", "--network-interface", ",", "python"], "no interface name"),
    (["-np", "2", "--gloo", "python"], "MPI only"),
])
def test_usage_errors(argv, words, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_NPROCS", raising=False)
    assert words in parse_error(argv, capsys)


def test_np_defaults(monkeypatch):
    assert options.parse_args(["-H", "a:2,b:3", "python", "x.py"]).np == 5
    monkeypatch.setenv("SLURM_NTASKS", "6")
    assert options.parse_args(["python", "x.py"]).np == 6


def test_command_keeps_its_own_flags():
    opts = options.parse_args(["-np", "2", "python", "train.py", "-np", "7", "--verbose"])
    assert opts.command == ["python", "train.py", "-np", "7", "--verbose"]
    assert opts.np == 2 and not opts.verbose


def test_settings_become_engine_variables(monkeypatch):
    monkeypatch.setenv("FROM_OUTSIDE", "outside")
    opts = options.parse_args([
        "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
        "--cache-capacity", "512", "--timeline-filename", "tl-%r.json", "--no-stall-check",
        "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds", "90",
        "--engine-priority", "idle", "--engine-affinity", "none", "--env", "A=1", "--env", "B=x=y", "--env", "FROM_OUTSIDE", "python", "x.py"])
    assert opts.rank_env == {
        "HVDLITE_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "HVDLITE_CYCLE_TIME": "2.5",
        "HVDLITE_CACHE_CAPACITY": "512",
        "HVDLITE_TIMELINE": os.path.abspath("tl-%r.json"),
        "HVDLITE_STALL_CHECK_DISABLE": "1",
        "HVDLITE_STALL_CHECK_TIME_SECONDS": "30",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HVDLITE_ENGINE_PRIORITY": "idle",
        "HVDLITE_ENGINE_AFFINITY": "none",
        "A": "1", "B": "x=y", "FROM_OUTSIDE": "outside"}


def test_unset_flags_set_nothing():
    assert options.parse_args(["-np", "1", "python"]).rank_env == {}


def test_horovodrun_compatibility_flags():
    """horovodrun command lines keep working: flags with a meaning here set it,
    the others (no cache to disable, always MPI, stall check on by default)
    are accepted and change nothing."""
    opts = options.parse_args(["-np", "2", "--timeline-mark-cycles", "--stall-check",
                               "--disable-cache", "--mpi", "python", "x.py"])
    assert opts.rank_env == {"HVDLITE_TIMELINE_MARK_CYCLES": "1"}
    assert opts.command == ["python", "x.py"]
    opts = options.parse_args(["-np", "2", "--no-timeline-mark-cycles", "python"])
    assert opts.rank_env == {"HVDLITE_TIMELINE_MARK_CYCLES": "0"}
    opts = options.parse_args(["-np", "2", "--autotune", "--autotune-log-file", "tune.csv",
                               "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "5",
                               "--autotune-bayes-opt-max-samples", "20", "--autotune-gaussian-process-noise",
                               "0.8", "python"])
    assert opts.rank_env == {"HVDLITE_AUTOTUNE": "1", "HVDLITE_AUTOTUNE_LOG": os.path.abspath("tune.csv"),
                             "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "1", "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "5"}
    for kind in ("allreduce", "allgather"):
        for flag, value in ((f"--hierarchical-{kind}", "1"), (f"--no-hierarchical-{kind}", "0")):
            opts = options.parse_args(["-np", "2", flag, "python"])
            assert opts.rank_env == {f"HVDLITE_HIERARCHICAL_{kind.upper()}": value}, flag


def test_cli_version_and_usage_error_exit_codes():
    argv, extra = hvdrun_argv()
    env = dict(os.environ, **extra)
    p = subprocess.run(argv + ["--version"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "hvdrun (hvdlite) " in p.stdout
    p = subprocess.run(argv + ["-np", "3", "-H", "a:1", "python"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 2
    assert p.stderr.splitlines()[0] == \
        "hvdrun: error: -np 3 is more than the 1 slots of -H (a:1); add slots or lower -np"


def test_console_script_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "hvdrun")
    if not os.path.exists(exe):
        unavailable("the hvdrun console script is not installed next to %s (pip install -e .)"
                    % sys.executable)
    p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "hvdrun (hvdlite)" in p.stdout


# ---- SSH -----------------------------------------------------------------------------

SSH_ERRORS = [
    ("ssh: connect to host n2 port 22: Connection refused", "connection refused"),
    ("ssh: connect to host n2 port 22: Connection timed out", "timed out after 3 s"),
    ("ssh: connect to host n2 port 22: No route to host", "no route to host"),
    ("ssh: Could not resolve hostname n9: Name or service not known", "unknown host name"),
    ("ssh: Could not resolve hostname n9: Temporary failure in name resolution", "unknown host name"),
    ("root@n2: Permission denied (publickey).", "permission denied"),
    ("Host key verification failed.", "host key verification failed"),
    ("kex_exchange_identification: Connection closed by remote host", "closed by the remote side"),
    ("something new and strange", "ssh failed: something new and strange"),
]


@pytest.mark.parametrize("stderr,words", SSH_ERRORS)
def test_ssh_error_texts(stderr, words):
    opts = ssh_check.SshOptions("/usr/bin/ssh", connect_timeout=3)
    assert words in ssh_check.classify(255, stderr + "\n", opts)


def test_ssh_missing_python_and_success():
    opts = ssh_check.SshOptions("/usr/bin/ssh")
    assert ssh_check.classify(0, "", opts) is None
    assert "/opt/py/bin/python does not exist there" in \
        ssh_check.classify(97, "", opts, python="/opt/py/bin/python")


def test_ssh_never_prompts():
    opts = ssh_check.SshOptions("/usr/bin/ssh", port=2222, identity="/k/id", connect_timeout=3)
    argv = opts.argv()
    assert "BatchMode=yes" in argv and "ConnectTimeout=3" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"
    script = opts.wrapper_script()
    assert script.startswith("#!/bin/sh\nexec /usr/bin/ssh -o BatchMode=yes") and '"$@"' in script


def test_local_hosts_are_not_checked_over_ssh():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1")
    assert not hosts.is_local("no-such-host.invalid")
    opts = ssh_check.SshOptions("/nonexistent/ssh")
    [r] = ssh_check.check_hosts(["localhost"], opts)
    assert r.ok and r.local


# ---- MPI detection and commands ------------------------------------------------------

def fake_mpi(tmp_path, tool):
    """A directory with an executable mpiexec and the flavour's marker tool next to it."""
    for name in ("mpiexec", tool):
        p = tmp_path / name
        p.write_text("#!/bin/sh\necho 'MPICH Version:      9.9.9'\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path / "mpiexec")


@pytest.mark.parametrize("tool,flavour", [("mpichversion", "mpich"), ("ompi_info", "openmpi")])
def test_detect_mpi_explicit(tmp_path, monkeypatch, tool, flavour):
    monkeypatch.setenv("HVDLITE_MPIEXEC", fake_mpi(tmp_path, tool))
    info = mpi_detect.detect_mpi()
    assert (info.flavour, info.mpiexec, info.source) == (flavour, str(tmp_path / "mpiexec"),
                                                        "$HVDLITE_MPIEXEC")


def test_detect_mpi_default_is_the_build_or_the_venv(monkeypatch):
    monkeypatch.delenv("HVDLITE_MPIEXEC", raising=False)
    info = mpi_detect.detect_mpi(with_version=True)
    assert info.flavour in ("mpich", "openmpi") and os.path.isabs(info.mpiexec)
    try:
        from hvdlite import _build_info
    except ImportError:
        return
    assert (info.flavour, info.mpiexec) == (_build_info.MPI_FLAVOUR, _build_info.MPIEXEC)
    assert info.version and info.version.split()[0] in ("MPICH", "Open")


def spec(**kw):
    base = dict(np=4, command=["python", "train.py", "--lr", "0.1"], python="/venv/bin/python",
                hosts=hosts.parse_hosts_arg("n1:2,n2:2"), ssh_script="/tmp/x/ssh",
                interfaces=["eth1"], env={"HVDLITE_CYCLE_TIME": "2.0"}, mpi_args=["-verbose"],
                cpu_count=2, is_root=True)
    base.update(kw)
    return mpi_command.LaunchSpec(**base)


def test_hydra_command():
    argv, extra = mpi_command.hydra_command("/venv/bin/mpiexec", spec())
    assert argv == ["/venv/bin/mpiexec", "-n", "4", "-hosts", "n1:2,n2:2",
                    "-launcher", "ssh", "-launcher-exec", "/tmp/x/ssh", "-iface", "eth1",
                    "-genv", "HVDLITE_CYCLE_TIME", "2.0", "-verbose",
                    "/venv/bin/python", "-S", mpi_command.WRAPPER, "--",
                    "python", "train.py", "--lr", "0.1"]
    assert extra == {}
    local, _ = mpi_command.hydra_command("mpiexec", spec(hosts=None, interfaces=[], mpi_args=[]))
    assert "-hosts" not in local and "-launcher" not in local


def test_openmpi_command():
    environ = {"PATH": "/venv/bin:/usr/bin", "HOSTNAME": "here", "OMPI_MCA_x": "1",
               "BASH_FUNC_f%%": "() {}", "MY_SETTING": "v"}
    argv, extra = mpi_command.openmpi_command("/venv/bin/mpirun", spec(), environ)
    joined = " ".join(argv)
    assert argv[:5] == ["/venv/bin/mpirun", "-np", "4", "--bind-to", "none"]
    assert "--allow-run-as-root" in argv
    assert "--host n1:2,n2:2" in joined
    assert "--mca btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1" in joined
    assert "-x HVDLITE_CYCLE_TIME=2.0" in joined
    assert "-x PATH" in joined and "-x MY_SETTING" in joined
    assert "HOSTNAME" not in joined and "OMPI_MCA_x" not in joined and "BASH_FUNC" not in joined
    assert "--oversubscribe" not in argv     # slots are explicit
    assert extra["OMPI_MCA_plm_rsh_agent"] == extra["PRTE_MCA_plm_ssh_agent"] == "/tmp/x/ssh"
    assert extra["OMPI_ALLOW_RUN_AS_ROOT"] == extra["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    local, extra = mpi_command.openmpi_command("mpirun", spec(hosts=None, is_root=False), environ)
    assert "--oversubscribe" in local and "--allow-run-as-root" not in local   # 4 ranks, 2 cores
    assert "OMPI_MCA_plm_rsh_agent" not in extra


def test_interface_env_steers_ucx_and_nccl_unless_set():
    assert mpi_command.interface_env(["eth1"], {"NCCL_SOCKET_IFNAME": "ib0"}) == \
        {"UCX_NET_DEVICES": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    assert mpi_command.interface_env([], {}) == {}


def test_expected_hosts():
    assert job.expected_hosts(hosts.parse_hosts_arg("a:2,b:2"), 3) == {0: "a", 1: "a", 2: "b"}


# ---- output records --------------------------------------------------------------------

def test_long_lines_are_cut_into_atomic_records():
    prefix = b"[12]<stdout>: "
    line = ("x" * 3000 + "é" * 3000).encode()
    recs = rank_wrapper.split_for_write(prefix, line)
    assert all(len(r) <= rank_wrapper.MAX_WRITE and r.startswith(prefix) and r.endswith(b"\n")
               for r in recs)
    assert b"".join(r[len(prefix):-1] for r in recs) == line
    for r in recs:
        r[len(prefix):-1].decode("utf-8")        # no record ends inside a character
    assert rank_wrapper.split_for_write(prefix, b"") == [prefix + b"\n"]


def test_report_lines_and_abort_messages():
    assert output.parse_report(b'@hvdlite-ctl@ {"event": "exit", "rank": 1, "code": 3}') == \
        {"event": "exit", "rank": 1, "code": 3}
    assert output.parse_report(b"[1]<stderr>: @hvdlite-ctl@ {}") is None
    d = output.AbortDetector()
    assert d.feed(b"[1]<stderr>: Abort(3) on node 1 (rank 1 in comm 0): application called "
                  b"MPI_Abort(MPI_COMM_WORLD, 3) - process 1") == (1, 3)
    assert d.feed(b"MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD") is None
    assert d.feed(b"with errorcode 7.") == (2, 7)


def test_rank_from_env():
    assert rank_wrapper.rank_from_env({"PMI_RANK": "3"}) == 3
    assert rank_wrapper.rank_from_env({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert rank_wrapper.rank_from_env({}) is None
    # In-place recovery: every rank is its own MPI job (PMI_RANK 0); its uid names it.
    assert rank_wrapper.rank_from_env({"PMI_RANK": "0", "HVDLITE_ELASTIC_UID": "7"}) == 7


def test_check_build(capsys):
    assert main(["--check-build"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hvdlite v")
    for words in ("Available frameworks:", "PyTorch", "TensorFlow", "MPI:", "GPU support:",
                  "NCCL", "Compressors:", "none, fp16, topk"):
        assert words in out, out
    assert "[X] MPICH" in out or "[X] Open MPI" in out


# ---- the rank wrapper on its own (no MPI launcher) --------------------------------------

def run_wrapper(code, rank="5", **kw):
    env = dict(os.environ, PMI_RANK=rank)
    return subprocess.Popen([sys.executable, "-S", mpi_command.WRAPPER, "--", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kw)


def reports(stderr):
    return [output.parse_report(l) for l in stderr.splitlines() if output.parse_report(l)]


def test_wrapper_prefixes_flushes_prompts_and_reports():
    code = ("import sys, time, os\n"
            "sys.stdout.write('prompt'); sys.stdout.flush(); time.sleep(1.6)\n"
            "print(' answered'); print('env', os.environ.get('HVDLITE_RANK_REPORTS'))\n"
            "sys.stderr.write('warn\\nno newline at the end'); sys.exit(3)\n")
    p = run_wrapper(code)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3
    assert out.splitlines() == [b"[5]<stdout>: prompt", b"[5]<stdout>:  answered", b"[5]<stdout>: env 1"]
    assert [l for l in err.splitlines() if not output.parse_report(l)] == \
        [b"[5]<stderr>: warn", b"[5]<stderr>: no newline at the end"]
    start, end = reports(err)
    assert start["event"] == "start" and start["rank"] == 5
    assert (end["event"], end["rank"], end["code"], end["signal"]) == ("exit", 5, 3, None)


def test_wrapper_forwards_stop_signals_and_reports_the_signal():
    code = ("import signal, sys, time\n"
            "def h(s, f):\n    print('got', s, flush=True); sys.exit(7)\n"
            "signal.signal(signal.SIGTERM, h)\nprint('up', flush=True)\ntime.sleep(60)\n")
    p = run_wrapper(code)
    assert p.stdout.readline() == b"[5]<stdout>: up\n"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert out == b"[5]<stdout>: got 15\n" and p.returncode == 7
    p = run_wrapper("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", rank="2")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 137 and reports(err)[-1]["signal"] == 9


def test_wrapper_relays_a_failing_announcement():
    code = ("import sys\nsys.stderr.write('@hvdlite-ctl@ {\"event\": \"failing\", \"code\": 2, "
            "\"reason\": \"boom\"}\\n')\nsys.stderr.write('@hvdlite-ctl@ not json\\n')\n")
    p = run_wrapper(code, rank="1")
    _, err = p.communicate(timeout=30)
    failing = [r for r in reports(err) if r["event"] == "failing"]
    assert failing == [{"event": "failing", "rank": 1, "host": failing[0]["host"], "code": 2,
                        "reason": "boom"}]
    assert b"[1]<stderr>: @hvdlite-ctl@ not json" in err      # not a report: shown as output


def test_rank_dies_with_its_wrapper():
    """If the MPI launcher SIGKILLs the wrapper, the kernel kills the rank too."""
    p = run_wrapper("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    child = int(p.stdout.readline().split()[-1])
    p.kill()
    p.wait()
    deadline = time.time() + 5
    while os.path.exists("/proc/%d" % child) and time.time() < deadline:
        with open("/proc/%d/stat" % child) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    else:
        assert not os.path.exists("/proc/%d" % child), "rank survived its wrapper"


def test_survivor_report_names_the_rank_that_exited():
    """A survivor's report can reach hvdrun before the failing rank's own; the
    survivor's error names that rank, and hvdrun blames it rather than the survivor."""
    _cause_elsewhere = mod("job")._cause_elsewhere
    prefix = "hvdlite.exceptions.HvdliteShutdownError: hvdlite has shut down: "
    assert _cause_elsewhere(prefix + "rank 3 called sys.exit(3) (exit code 3)") == (
        3, 3, "called sys.exit(3) (exit code 3)")
    assert _cause_elsewhere(prefix + "rank 1 exited with an unhandled exception: ValueError: x; "
                                     "rank 2 exited (its Python process ended)") == (1, 1, "ValueError: x")
    # A rank that shut down on purpose, or exited cleanly, is not a failure: the survivor is.
    assert _cause_elsewhere(prefix + "rank 3 called hvdlite.shutdown()") is None
    assert _cause_elsewhere(prefix + "rank 2 called sys.exit(0) (exit code 0)") is None
    assert _cause_elsewhere("ValueError: simulated failure in rank 1") is None


# ---- elastic jobs -------------------------------------------------------------------

elastic = mod("elastic")


def test_elastic_options():
    opts = options.parse_args(["--min-np", "2", "--max-np", "4", "-H", "a,b,c", "python", "x.py"])
    assert (opts.elastic, opts.min_np, opts.max_np, opts.np) == (True, 2, 4, 2)
    opts = options.parse_args(["-np", "3", "--host-discovery-script", "./d.sh", "--slots-per-host", "2",
                               "--reset-limit", "5", "--blacklist-cooldown-range", "10", "100",
                               "--elastic-timeout", "60", "python", "x.py"])
    assert (opts.min_np, opts.max_np, opts.slots_per_host, opts.reset_limit) == (3, None, 2, 5)
    assert opts.blacklist_cooldown_range == [10.0, 100.0] and opts.elastic_timeout == 60
    assert not options.parse_args(["-np", "2", "python", "x.py"]).elastic


@pytest.mark.parametrize("argv,words", [
    (["--min-np", "2"], "needs its hosts"),
    (["--min-np", "2", "-H", "a", "--host-discovery-script", "d"], "not both"),
    (["--min-np", "3", "--max-np", "2", "--host-discovery-script", "d"], "less than --min-np"),
    (["--min-np", "3", "-H", "a,b"], "more than the 2 slots"),
    (["--min-np", "0", "-H", "a"], "at least 1"),
    (["--min-np", "1", "-H", "a", "--blacklist-cooldown-range", "5", "1"], "MIN <= MAX"),
    (["--min-np", "1", "-H", "a", "--elastic-timeout", "0"], "must be positive"),
])
def test_elastic_usage_errors(argv, words, capsys):
    assert words in parse_error(argv + ["python", "x.py"], capsys)


def test_discovery_script_output(tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho 'a:2'\necho b\necho\necho '# c:4'\necho 'a:3'\n")
    script.chmod(0o755)
    found = elastic.HostDiscovery(str(script), slots_per_host=4).find()
    assert [(h.name, h.slots) for h in found] == [("a", 2), ("b", 4)]
    script.write_text("#!/bin/sh\necho 'a:x'\n")
    with pytest.raises(elastic.DiscoveryError, match="expected HOST or HOST:SLOTS"):
        elastic.HostDiscovery(str(script)).find()
    script.write_text("#!/bin/sh\necho oops >&2; exit 3\n")
    with pytest.raises(elastic.DiscoveryError, match="exited with 3: oops"):
        elastic.HostDiscovery(str(script)).find()


def test_plan_takes_slots_in_order_up_to_max_np():
    found = [hosts.Host("a", 2), hosts.Host("b", 2), hosts.Host("c", 2)]
    assert elastic.plan_hosts(found, None) == found
    assert elastic.plan_hosts(found, 3) == [hosts.Host("a", 2), hosts.Host("b", 1)]


def test_blacklist_forever_or_cooldown_doubling():
    forever = elastic.Blacklist()
    forever.add("a", "lost", now=0)
    assert not forever.allows("a", now=1e9) and forever.allows("b", now=0)
    cool = elastic.Blacklist((10, 25))
    cool.add("a", "lost", now=0)
    assert not cool.allows("a", now=9.9) and cool.allows("a", now=11.1)
    cool.add("a", "lost again", now=100)            # 20 s the second time
    assert not cool.allows("a", now=119.9) and cool.allows("a", now=122.1)
    cool.add("a", "and again", now=200)             # 40 s, capped at 25
    assert not cool.allows("a", now=224.9) and cool.allows("a", now=227.6)


@pytest.mark.parametrize("how,user", [
    ("failed: ValueError: bad shape", True),
    ("failed: hvdlite.exceptions.HvdliteTimeoutError: MPI_Iallreduce did not complete", False),
    ("failed: HvdliteShutdownError: hvdlite has shut down: rank 2 ...", False),
    ("was killed by SIGKILL", False),
    ("exited with code 3", False),
])
def test_user_errors_end_an_elastic_job(how, user):
    assert elastic._user_error(how) is user


def test_recovery_flag():
    elastic_job = ["--min-np", "2", "-H", "a,b", "python", "x.py"]
    assert options.parse_args(elastic_job).recovery == "auto"
    assert options.parse_args(["--recovery", "restart"] + elastic_job).recovery == "restart"


def test_recovery_flag_needs_an_elastic_job(capsys):
    assert "--recovery is for elastic jobs" in parse_error(["--recovery", "in-place", "-np", "2", "python",
                                                            "x.py"], capsys)


@pytest.mark.parametrize("flavour,device,requested,mode,words", [
    ("mpich", "ch4:ucx ofi", "auto", "in-place", "MPICH with the ofi netmod (ch4:ucx ofi) is there"),
    ("mpich", "ch4:ofi", "in-place", "in-place", "--recovery in-place, on MPICH with the ofi netmod"),
    ("mpich", "ch4:ucx", "auto", "restart", "this MPICH has only ch4:ucx"),
    ("mpich", "ch4:ucx", "in-place", None, "--recovery in-place: it needs MPICH's ofi netmod"),
    ("mpich", "ch4:ucx ofi", "restart", "restart", "--recovery restart"),
    ("openmpi", None, "auto", "restart", "this MPI is Open MPI 5.0.3"),
])
def test_recovery_mode_follows_the_mpi(tmp_path, flavour, device, requested, mode, words):
    """In place needs MPICH with the ofi netmod: hvdrun asks the mpichversion
    next to mpiexec which netmods it has."""
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text("#!/bin/sh\n")
    if device is not None:
        tool = tmp_path / "mpichversion"
        tool.write_text("#!/bin/sh\necho 'MPICH Version:      5.0.2'\necho 'MPICH Device:       %s'\n" % device)
        tool.chmod(0o755)
    mpi = mpi_detect.MpiInfo(flavour, str(mpiexec), "Open MPI 5.0.3" if flavour == "openmpi" else "MPICH 5.0.2")
    got, why = mod("recovery").choose(requested, mpi)
    assert got == mode and words in why, (got, why)


def test_hosts_version_service_answers_the_version():
    service = elastic.HostsVersionService()
    address = service.serve_on("127.0.0.1")
    host, _, port = address.rpartition(":")

    def ask(token):
        import socket
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(b"%s version\n" % token.encode())
            return s.makefile().readline()
    try:
        assert int(ask(service.token)) == 0
        service.bump()
        assert int(ask(service.token)) == 1
        assert ask("0" * len(service.token)) == "", "answered without the job's token"
        assert ask("") == ""
        assert service.serve_on("127.0.0.1") == address     # same address: same server
    finally:
        service.close()


# ---- clusters -----------------------------------------------------------------------

@pytest.mark.parametrize("var", hosts.MPIJOB_HOSTFILE_VARS)
def test_mpijob_hostfile_is_taken_without_h(tmp_path, monkeypatch, var):
    f = tmp_path / "hostfile"
    f.write_text("hvdlite-train-worker-0.hvdlite-train-worker.default.svc slots=2\n"
                 "hvdlite-train-worker-1.hvdlite-train-worker.default.svc:2\n")
    for v in hosts.MPIJOB_HOSTFILE_VARS + ("SLURM_JOB_ID",):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, str(f))
    opts = options.parse_args(["python", "x.py"])
    assert [(h.name, h.slots) for h in opts.hosts] == [
        ("hvdlite-train-worker-0.hvdlite-train-worker.default.svc", 2),
        ("hvdlite-train-worker-1.hvdlite-train-worker.default.svc", 2)] and opts.np == 4
    assert "2 hosts, 4 slots" in hosts.scheduler_description()
    # -H still wins
    assert [h.name for h in options.parse_args(["-H", "a:2", "python", "x.py"]).hosts] == ["a"]


def test_slurm_allocation_is_described(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    assert hosts.scheduler_description() == "SLURM job 12: 4 tasks on 2 nodes (node[1-2])"


def test_mpijob_manifest_in_docs_is_an_mpijob():
    yaml = pytest.importorskip("yaml") if not REQUIRE_ALL else importlib.import_module("yaml")
    text = open(os.path.join(REPO, "docs", "launcher.md")).read()
    blocks = [b for b in text.split("```yaml\n")[1:]]
    manifests = [yaml.safe_load(b.split("```")[0]) for b in blocks]
    jobs = [m for m in manifests if isinstance(m, dict) and m.get("kind") == "MPIJob"]
    assert len(jobs) == 1, manifests
    job = jobs[0]
    assert job["apiVersion"] == "kubeflow.org/v2beta1"
    spec = job["spec"]
    assert set(spec["mpiReplicaSpecs"]) == {"Launcher", "Worker"} and spec["slotsPerWorker"] >= 1
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][0] == "hvdrun" and "pytorch_digits.py" in launcher["command"][-1]


def _gone(pid, timeout=5.0):
    """True once ``pid`` no longer runs (gone, or a zombie awaiting its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_kill_leftovers_ends_what_an_ended_launcher_left_in_its_group():
    """An ended launcher's process group (what it started and left running, as
    an ssh to a host whose link went down) is killed; a launcher still running
    is left alone."""
    launcher = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; read line"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    left = int(launcher.stdout.readline())
    try:
        job.kill_leftovers(launcher)            # running: nothing happens
        assert launcher.poll() is None and not _gone(left, timeout=0.2)
        launcher.stdin.close()                  # the launcher ends; its sleep stays
        launcher.wait(timeout=10)
        assert not _gone(left, timeout=0.2)
        job.kill_leftovers(launcher)
        assert _gone(left), "the launcher's leftover %d still runs" % left
    finally:
        if not _gone(left, timeout=0):
            os.kill(left, signal.SIGKILL)
