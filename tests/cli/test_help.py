"""Every --help reads as written: no format escapes left in it (argparse formats an argument's help, not a
parser's description, so a "%%" there reaches the user as two percent signs)."""
import pytest

from app.kernel.cli import main

COMMANDS = [[], ["join"], ["overlay"], ["list"], ["devices"], ["calibrate"], ["compare"], ["ab"], ["devlog"], ["timeline"],
            ["sweep"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "main")
def test_help_has_no_format_escapes(argv, capsys):
    try:
        code = main([*argv, "--help"])
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr().out
    assert code in (0, None) and out.strip()
    assert "%%" not in out and "%(" not in out
