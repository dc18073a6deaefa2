"""What `moe-stack up` quotes of an engine's log when the stack does not become healthy."""

from builder.stacks.run import log_error_summary

# ik_llama.cpp 0.1.5 on `-ot ffn_.*_exps=NO_SUCH_BUFFER`: two error lines, then the engine restarts.
IK_ATTEMPT = (
    "error: Invalid tensor buffer type override: ffn_.*_exps=NO_SUCH_BUFFER\n"
    "error: invalid parameter for argument: --override-tensor\n"
)


def test_a_restarting_engine_is_quoted_the_same_whichever_attempt_was_cut_short() -> None:
    whole = (
        "error: Invalid tensor buffer type override: ffn_.*_exps=NO_SUCH_BUFFER / "
        "error: invalid parameter for argument: --override-tensor"
    )
    assert log_error_summary(IK_ATTEMPT) == whole
    assert log_error_summary(IK_ATTEMPT * 2) == whole
    assert log_error_summary(IK_ATTEMPT * 2 + IK_ATTEMPT.splitlines()[0]) == whole


def test_the_error_is_found_before_a_usage_text_and_without_terminal_codes() -> None:
    log = (
        "\x1b[32mloading\x1b[0m\nerror: invalid argument: --no-mmap\n"
        "usage: llama-server [options]\n  -h, --help\n"
    )
    assert log_error_summary(log) == "error: invalid argument: --no-mmap"


def test_a_log_without_an_error_gives_its_last_line() -> None:
    assert log_error_summary("main: loading model\nkilled\n") == "killed"
    assert log_error_summary("") == "(empty)"
