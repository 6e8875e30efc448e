"""The command line as a user meets it, for every recipe's tests: in this process (``cli.main``,
its error output captured) or in a process of its own (offline: transformers binds its log
handler and huggingface_hub reads ``HF_HUB_OFFLINE`` when first imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adaptcl import cli
from tests.recipes._process import REPO, env_with_src


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    """``python -m adaptcl <argv>`` offline, from the checkout (``tests`` importable: the
    current folder is on the path of ``-m``)."""
    environ = env_with_src(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "adaptcl", *argv], capture_output=True,
                          text=True, env=environ, cwd=REPO, timeout=600, check=False)


def one_line_error(capsys, argv: list[str], expected: str) -> str:
    """``cli.main(argv)`` exits 2 with exactly one error line ``adaptcl <recipe>: error: ...``
    holding ``expected`` (and no traceback); the line."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # a refusal of the option parser
        code = exit_.code
    err = capsys.readouterr().err
    # third-party progress bars (the model-loading of transformers) may precede our one line
    lines = [line for line in err.splitlines() if line.startswith("adaptcl ")
             or "error" in line.lower()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"adaptcl {argv[0]}: error: "), err
    assert expected in lines[0], err
    return lines[0]


def refused_before_any_file(capsys, argv: list[str], expected: str, out: Path) -> str:
    """:func:`one_line_error` of ``argv`` with ``--output-dir out``, and ``out`` never made (no
    ``config.yaml``, no run store, no lock); the line."""
    line = one_line_error(capsys, [*argv, "--output-dir", str(out)], expected)
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    return line


def one_line_error_in_a_process(argv: list[str], expected_start: str) -> str:
    """:func:`one_line_error` for a command run in a process of its own."""
    done = run_cli(*argv)
    ours = [line for line in done.stderr.splitlines() if line.startswith("adaptcl ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert ours == [ours[0]] and ours[0].startswith(expected_start), done.stderr
    return ours[0]


def check_help(recipe: str) -> None:
    """``adaptcl <recipe> --help`` is fast, shows the shared options, their defaults and an
    example, and building it imports no framework (neither torch nor transformers)."""
    import time

    start = time.perf_counter()
    done = run_cli(recipe, "--help")
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 3.0, f"adaptcl {recipe} --help took {elapsed:.1f} s"
    for option in ("--data-root", "--output-dir", "--threads", "--device", "--precision",
                   "--config", "--preset"):
        assert option in done.stdout
    assert "(default: " in done.stdout and "example:" in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import contextlib, io, sys\n"
         f"from adaptcl.recipes.{recipe}.recipe import RECIPE\n"
         "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
         f"    RECIPE.main(['--help'], 'adaptcl {recipe}')\n"
         "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') "
         "if m in sys.modules))"],
        capture_output=True, text=True, env=env_with_src(), check=True)
    assert probe.stdout.strip() == "[]"
