"""What the package claims to support is what the tox matrix tests and what the README says, in step."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _classifiers() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text.split("classifiers = [", 1)[1].split("]", 1)[0]
    return re.findall(r'"([^"]+)"', block)


def _tox_envs() -> list[str]:
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    envs: list[str] = []
    for line in tox["tox"]["env_list"].split():
        # py{312,313}-django{52,60,61}, py311-django52-redis{50,53}: each factor's braces expanded.
        combos = [""]
        for factor in line.split("-"):
            braced = re.fullmatch(r"([a-z]+)\{([^}]*)\}", factor)
            values = [braced[1] + o for o in braced[2].split(",")] if braced else [factor]
            combos = [f"{c}-{v}" if c else v for c in combos for v in values]
        envs += combos
    return envs


def _factor(env: str, name: str) -> str | None:
    """The value of ``env``'s factor ``name`` ("django" in py312-django60: "60"), None without one."""
    return next((f[len(name) :] for f in env.split("-") if re.fullmatch(name + r"\d+", f)), None)


def _dotted(code: str) -> str:
    return f"{code[0]}.{code[1:]}"


def test_django_versions_agree_between_classifiers_tox_and_readme() -> None:
    classified = {c.rsplit(" :: ", 1)[1] for c in _classifiers() if c.startswith("Framework :: Django :: ")}
    tested = {_dotted(str(_factor(env, "django"))) for env in _tox_envs()}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    claimed = re.search(r"\u00d7 Django ([\d./ ]+)", readme)  # the tox line of the README
    assert claimed is not None
    assert classified == tested == {v.strip() for v in claimed.group(1).split("/")}


def test_python_versions_agree_between_classifiers_tox_and_metadata() -> None:
    classified = {
        c.rsplit(" :: ", 1)[1] for c in _classifiers() if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    tested = {_dotted(env.split("-")[0][2:]) for env in _tox_envs()}
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    lowest = re.search(r'requires-python = ">=([\d.]+)"', pyproject)
    assert lowest is not None and min(tested, key=lambda v: tuple(map(int, v.split(".")))) == lowest.group(1)
    assert classified == tested


def test_tox_tests_the_oldest_redis_py_the_redis_extra_admits() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    floor = re.search(r'^redis = \["redis>=(\d+)(?:\.(\d+))?"\]$', pyproject, re.M)
    assert floor is not None
    tox = (ROOT / "tox.ini").read_text(encoding="utf-8")
    for code in {_factor(env, "redis") for env in _tox_envs()} - {None}:
        assert re.search(rf"^    redis{code}: redis>=", tox, re.M), code  # each factor pins a range
    oldest = f"{floor[1]}{floor[2] or 0}"
    assert re.search(rf"^    redis{oldest}: redis>={floor[1]}\.{floor[2] or 0},", tox, re.M)
    assert any(_factor(env, "redis") == oldest for env in _tox_envs())


def test_tox_tests_only_final_releases_and_leaves_no_venv_redirect() -> None:
    tox = (ROOT / "tox.ini").read_text(encoding="utf-8")
    assert "pip_pre" not in tox and not re.search(r"Django>=[\d.]+(a|b|rc)\d", tox)
    assert re.search(r"^venv_redirect = false$", tox, re.M)  # make's .venv/ directory stays a directory
    # Without it the package's dependencies re-resolve Django (django61 ran Django 6.0.10).
    assert re.search(r"^constrain_package_deps = true$", tox, re.M)
    assert ".venv\n" in (ROOT / ".gitignore").read_text(encoding="utf-8").replace(".venv/\n", "")


def _fake_python(path: Path) -> Path:
    """A stand-in interpreter for make: `-m venv DIR` makes DIR/bin/python (itself); anything else succeeds."""
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi\n'
        "exit 0\n"
    )
    path.chmod(0o755)
    return path


def test_make_replaces_a_venv_redirect_file_left_by_tox(tmp_path: Path) -> None:
    import shutil
    import subprocess

    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv").write_text(".tox/py312-django61\n")  # what tox's PEP 832 redirect looks like
    python = _fake_python(tmp_path / "fakepython")
    result = subprocess.run(
        ["make", "-C", str(tmp_path), ".venv/.installed", f"PYTHON={python}"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".venv").is_dir() and (tmp_path / ".venv" / ".installed").exists()
    assert "tox venv redirect" in result.stdout


def test_every_demo_target_listens_on_port(tmp_path: Path) -> None:
    import subprocess

    for target in ("demo", "demo-gunicorn", "demo-uvicorn", "demo-redis", "demo-cluster"):
        result = subprocess.run(
            ["make", "-n", "-C", str(ROOT), target, "PORT=8765", "VENV=" + str(tmp_path / "v")],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        assert "8765" in result.stdout and "8000" not in result.stdout, (target, result.stdout)
