"""Run several command-line invocations of the tools in one fresh Python process.

Starting a tool costs ~8-10 s of imports on the test machine; the tests of independent error
messages run their invocations here one after another and pay it once. Each invocation runs as
``python SCRIPT ARGS`` would: ``runpy`` with ``__name__ == '__main__'``, its own ``sys.argv``,
file descriptors 1 and 2 sent to a log file (so that logging handlers and C code are captured
too), the exit status from ``SystemExit``, and an uncaught exception printed by
``sys.excepthook`` with status 1, as the interpreter does.

    python tests/cli_driver.py JOBS.json RESULTS.json

``JOBS.json``: ``{name: {"argv": [script, *args], "env": {...}}}`` (script relative to the
repository root, env entries set for that invocation only); ``RESULTS.json``:
``{name: {"returncode": int, "output": str}}``. Use a subprocess of its own where isolation
is what a test checks (e.g. a config's ``custom_imports`` loading mmeffvit).
"""
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit('message'), as the interpreter reports it
    return 1


def run_one(argv, env):
    """Run ``argv`` in this process; return its exit status and everything it printed."""
    saved_env = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    saved_argv = sys.argv
    sys.argv = list(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile('w+') as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            runpy.run_path(os.path.join(ROOT, argv[0]), run_name='__main__')
            status = 0
        except SystemExit as exit_:
            status = _exit_status(exit_.code)
        except BaseException:  # noqa: B902 - reported like the interpreter's handler does
            sys.excepthook(*sys.exc_info())
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.argv = saved_argv
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        log.seek(0)
        return status, log.read()


def main(jobs_path, results_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    os.chdir(ROOT)
    results = {}
    stamp = None
    for name, job in jobs.items():
        # mmengine names a run's logger, scope and visualizer after its start second: give each
        # invocation its own second, as separate processes would have
        while time.strftime('%Y%m%d_%H%M%S') == stamp:
            time.sleep(0.05)
        status, output = run_one(job['argv'], job.get('env', {}))
        stamp = time.strftime('%Y%m%d_%H%M%S')
        results[name] = dict(returncode=status, output=output)
    with open(results_path, 'w') as f:
        json.dump(results, f)


def run_jobs(jobs, work_dir, env, timeout=1800):
    """From a test: run ``jobs`` (see the module docstring) in one driver process with ``env``;
    return ``{name: (returncode, output)}``."""
    jobs_path = os.path.join(str(work_dir), 'cli_jobs.json')
    results_path = os.path.join(str(work_dir), 'cli_results.json')
    with open(jobs_path, 'w') as f:
        json.dump(jobs, f)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), jobs_path, results_path],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f'the driver failed:\n{(proc.stdout + proc.stderr)[-4000:]}'
    with open(results_path) as f:
        return {name: (r['returncode'], r['output']) for name, r in json.load(f).items()}


if __name__ == '__main__':
    main(*sys.argv[1:])
