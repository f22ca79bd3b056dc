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


def _help(argv, capsys) -> str:
    try:
        main([*argv, "--help"])
    except SystemExit:
        pass
    return capsys.readouterr().out


def _entries(out: str) -> dict[str, str]:
    """Each option's line(s) in the options list: '--flag METAVAR' -> its help text, whitespace joined."""
    import re

    body = out.split("\noptions:\n", 1)[1]
    entries, name = {}, None
    for line in body.splitlines():
        m = re.match(r"  (-{1,2}[\w-]+)(.*)", line)
        if m:
            name = m.group(1)
            entries[name] = m.group(2).strip()
        elif name and line.strip():
            entries[name] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in entries.items()}


@pytest.mark.parametrize("kernel", ["join", "overlay"])
def test_kernel_help_shows_readable_metavars_choices_and_defaults(kernel, capsys):
    import re

    from app.kernel.plan import default_version, get_plan_class, kernels

    out = _help([kernel], capsys)
    # argparse's fallback metavar is the destination upper-cased (PARAM_POINTS, NCU_TIMEOUT, OUT): never shown
    assert "PARAM_" not in out, out
    for flag, metavar in re.findall(r"\[(--[\w-]+) ([A-Z_]+)\]", out):
        assert metavar != flag.lstrip("-").upper().replace("-", "_"), f"{flag} shows argparse's fallback {metavar}"
    entries = _entries(out)
    cls = get_plan_class(kernel, default_version(kernel, kernels()[kernel]))
    for p in cls.params_spec:
        text = entries[f"--{p.name}"]
        if p.choices:
            shown = "{" + ",".join(map(str, p.choices)) + "}"
            assert text.startswith(shown), f"--{p.name} does not show its choices {shown}: {text}"
        elif p.type is int:
            assert text.startswith("N "), f"--{p.name}: {text}"
        assert f"(default {p.default})" in text, f"--{p.name} does not state its default: {text}"
    for flag in ("--prof_type", "--device", "--bench_runs", "--l2", "--overhead", "--warmup", "--out",
                 "--ncu", "--ncu-timeout", "--ncu-clock-control", "--nsys", "--nsys-timeout", "--backend"):
        assert "default" in entries[flag], f"{flag} does not state its default: {entries[flag]}"
    assert entries["--out"].startswith("DIR ") and entries["--ncu"].startswith("PATH ")
    assert entries["--ncu-timeout"].startswith("SECONDS ") and entries["--nsys-timeout"].startswith("SECONDS ")


@pytest.mark.parametrize("kernel", ["join", "overlay"])
def test_tiling_example_names_a_stage_of_each_kernel(kernel, capsys):
    """--tiling's help is shared by every kernel: each example it gives must name a real stage and tunable."""
    import re

    from app.kernel.plan import kernels

    text = _entries(_help([kernel], capsys))["--tiling"]
    examples = re.findall(r"(\w+)\.(\w+)=(-?\d+) for (\w+)", text)
    assert {k for *_, k in examples} >= set(kernels()), text
    for stage, key, value, k in examples:
        for cls in kernels()[k].values():
            tunables = {s.name: s.tunables for s in cls.stages}
            assert int(value) in tunables.get(stage, {}).get(key, ()), \
                f"{stage}.{key}={value} is not a tiling of {k} {cls.version}"


@pytest.mark.parametrize("device,says,never", [
    ("auto", "nsys mode (nsys) needs a GPU and none is usable here (CUDA reports no devices); use --prof_type event "
             "to profile on the CPU", "--device"),
    ("gpu", "--device gpu was asked for but CUDA reports no devices", None),
    ("cpu", "needs a GPU but --device cpu was asked for", None),
])
def test_a_gpu_mode_without_a_gpu_names_only_flags_the_user_passed(device, says, never, tmp_path, capsys, monkeypatch):
    """With the default --device auto there is no --device flag to blame: the error says why no GPU is usable and
    how to profile on the CPU instead (not "--device gpu was asked for ... use --device cpu or auto")."""
    from app.runtime import device as devmod

    monkeypatch.setattr(devmod, "probe_gpu", lambda: (False, "CUDA reports no devices", {}))
    argv = ["join", "--prof_type", "nsys", "--out", str(tmp_path / "out")]
    assert main(argv + ([] if device == "auto" else ["--device", device])) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert never is None or never not in err[0], err
    assert not (tmp_path / "out").exists()


def test_list_help_says_what_list_prints_and_a_bad_tiling_names_a_real_stage(capsys):
    from app.errors import BadParameter

    assert main(["list", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m app.kernel list\n") and "v1:" not in out     # help, not the list
    from app.kernel.plan import get_plan_class
    from app.runtime.autotune import parse_overrides
    with pytest.raises(BadParameter, match=r"expected STAGE.KEY=VALUE, e\.g\. segment_\w+\.\w+="):
        parse_overrides(["xx"], get_plan_class("overlay", "v3"))
