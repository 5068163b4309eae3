"""`sandbox up --retries`, `--hedge-ms`, `--clump`, `--rows`: the load's clients retry what is
refused, hedge, send requests in clumps or of varied rows; or the run is refused."""

from __future__ import annotations

import argparse

import pytest

from batchpilot.sandbox.up import SandboxOptions, add_arguments, clumping, main, retrying


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_load_generator_gets_the_retries() -> None:
    assert retrying(SandboxOptions()) == []
    assert retrying(SandboxOptions(retries=2)) == ["--retries", "2"]
    assert retrying(SandboxOptions(retries=4, retry_delay_s=0.0)) == [
        "--retries",
        "4",
        "--retry-delay-s",
        "0",
    ]
    assert retrying(SandboxOptions(retries=1, mark_retries=True)) == [
        "--retries",
        "1",
        "--mark-retries",
    ]


@pytest.mark.parametrize("argv", [("--retries", "-1"), ("--retries", "2", "--retry-delay-s", "60")])
def test_nonsense_is_refused_before_anything_starts(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(parsed(*argv)) == 2
    assert "--retries must be 0 or more" in capsys.readouterr().err


def test_marking_retries_needs_retries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(parsed("--mark-retries")) == 2
    assert "--mark-retries needs --retries or --hedge-ms" in capsys.readouterr().err


def test_the_load_generator_gets_the_hedging() -> None:
    assert retrying(SandboxOptions(hedge_ms=40.0)) == ["--hedge-ms", "40"]
    assert retrying(SandboxOptions(hedge_ms=25.0, mark_retries=True)) == [
        "--hedge-ms",
        "25",
        "--mark-retries",
    ]


@pytest.mark.parametrize("argv", [("--hedge-ms", "0"), ("--hedge-ms", "40", "--retries", "1")])
def test_hedging_nonsense_is_refused(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(parsed(*argv)) == 2
    assert "--hedge-ms is a delay above 0" in capsys.readouterr().err


def test_the_load_generator_gets_the_clumps(capsys: pytest.CaptureFixture[str]) -> None:
    assert clumping(SandboxOptions()) == []
    assert clumping(SandboxOptions(clump=4.0)) == ["--clump", "4"]
    assert clumping(SandboxOptions(rows="1:9,16:1")) == ["--rows", "1:9,16:1"]
    assert clumping(SandboxOptions(rows="4")) == ["--rows", "4"]
    for rows in ("0", "1:9,16", "x"):
        assert main(parsed("--rows", rows)) == 2
        assert "error: --rows:" in capsys.readouterr().err
    for argv in (("--clump", "0.5"), ("--clump", "3", "--arrivals", "uniform")):
        assert main(parsed(*argv)) == 2
        assert "--clump is a mean clump size" in capsys.readouterr().err
