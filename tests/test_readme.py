"""The README's two set-up commands are exactly what CI runs, and they name every in-tree distribution."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_them():
    commands = readme_setup_commands()
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands:
        assert command in ci, f"CI does not run the README command: {command}"


def test_install_command_covers_every_distribution():
    requirements = (ROOT / "requirements.txt").read_text()
    pyprojects = [ROOT / "conformance" / "pyproject.toml", *ROOT.glob("plugins*/*/pyproject.toml")]
    distributions = [p.parent.relative_to(ROOT) for p in pyprojects if p.exists()]
    assert distributions, "expected in-tree distributions (conformance, plugins)"
    for dist in distributions:
        assert f"-e ./{dist.as_posix()}" in requirements, f"requirements.txt does not install {dist}"
