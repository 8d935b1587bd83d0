"""Entry point of ``hvdrun`` and ``python -m hvdlite.launcher``."""

import sys

from .options import parse_args, version_text


def main(argv=None):
    opts = parse_args(argv)
    if opts.version:
        print(version_text())
        return 0
    if opts.check_build:
        from .check_build import check_build
        print(check_build())
        return 0
    from .job import run_job
    try:
        if opts.elastic:
            from .recovery import run_elastic
            return run_elastic(opts)
        return run_job(opts)
    except KeyboardInterrupt:       # Ctrl-C before the job started (e.g. during the SSH check)
        sys.stderr.write("hvdrun: interrupted before the job started\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
