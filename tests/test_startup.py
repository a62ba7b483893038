"""What `lattice run` does before its first pod (#35): the CPU it spends there is CPU per
pod in the headline benchmark, so these guard the savings of docs/performance.md.

The process entry imports only the `run` subcommand's modules and freezes what start-up
built; a parser built for one subcommand parses that subcommand's command lines exactly as
the whole parser does.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Sequence

import pytest

from scheduler.cli import COMMANDS, _command_of, build_parser

# Imported before the first pod, they would cost CPU for nothing: the agent, simulator,
# graph CLI and dev tooling belong to other subcommands.
NOT_AT_START = (
    "scheduler.agent",
    "scheduler.sim",
    "scheduler.graph.cli",
    "lattice_dev",
)


def test_lattice_run_imports_only_its_own_and_freezes_them() -> None:
    """`lattice run` to the point it first needs the API server (a missing kubeconfig stops
    it there, exit 1), through the entry point the console script and `-m` use."""
    code = (
        "import gc, sys\n"
        "sys.argv = ['lattice', 'run', '--kubeconfig', '/nonexistent/kubeconfig']\n"
        "from scheduler.cli import main\n"
        "rc = main()\n"
        f"early = sorted(m for m in sys.modules if m.startswith({NOT_AT_START!r}))\n"
        "print(rc, gc.isenabled(), gc.get_freeze_count(), ','.join(early), sep='|')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    rc, enabled, frozen, early = out.stdout.strip("\n").split("|")
    assert (rc, enabled, early) == ("1", "True", "")
    assert int(frozen) > 100_000  # kopf, the Kubernetes client, numpy and ours
    assert "kubeconfig /nonexistent/kubeconfig does not exist" in out.stderr


def test_in_process_callers_keep_their_collector() -> None:
    code = (
        "import gc\n"
        "from scheduler.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split()[-2:] == ["True", "0"]


def _answer(parser_for: str | None, argv: Sequence[str]) -> tuple[object, str, str]:
    """What parsing ``argv`` gives: the namespace or exit code, stdout, stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            result: object = vars(build_parser(parser_for).parse_args(argv))
        except SystemExit as exc:
            result = exc.code
    return result, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--help"],
        ["run", "--no-leader-elect", "--metrics-port", "0", "--log-level", "debug"],
        ["run", "--metrics-port", "70000"],
        ["run", "--retry-period", "0"],
        ["run", "--bogus"],
        ["simulate", "--nodes", "n.csv", "--tasks", "t.csv", "--gangs", "--seed", "3"],
        ["simulate", "--help"],
        ["agent", "--help"],
        ["explain", "--help"],
        ["selftest", "--help"],
        ["cleanup", "--help"],
        ["graph", "--help"],
        ["devcluster", "up", "--nodes", "5"],
        ["demo", "--nodes", "3"],
    ],
    ids=" ".join,
)
def test_a_parser_for_one_command_answers_as_the_whole_one(argv: list[str]) -> None:
    command = _command_of(argv)
    assert command == argv[0]
    assert _answer(command, argv) == _answer(None, argv)


@pytest.mark.parametrize(
    "argv", [[], ["--help"], ["--version"], ["-h", "run"], ["--", "run"], ["runn"]], ids=str
)
def test_other_command_lines_get_the_whole_parser(argv: list[str]) -> None:
    assert _command_of(argv) is None


def test_every_subcommand_is_known_by_name() -> None:
    """A subcommand missing from COMMANDS would still work (whole parser) but pay for every
    other subcommand's imports; one in COMMANDS but not in the parser would be a typo."""
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.dest == "command")
    assert sub.choices is not None
    assert sorted(sub.choices) == sorted(COMMANDS)
