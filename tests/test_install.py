"""An installed harness: check runs the suite shipped in the package, writes its report
under the current directory, and loads the pytest plugin once. The install itself, a wheel in a new
venv run from outside the checkout, is .ci/install_check (CI runs it)."""

import os
import subprocess
from pathlib import Path

from harness.cli import main
from harness.run import check, pytest_command

ROOT = Path(__file__).resolve().parent.parent


def fake_pytest(seen: dict):
    def run(cmd, cwd, env):  # noqa: ANN001, ANN202
        seen.update(cmd=cmd, cwd=cwd)
        return subprocess.CompletedProcess(cmd, 0)

    return run


def test_a_checkout_runs_its_cases_folder_with_its_configuration_and_the_plugin():
    where = pytest_command.suite()
    assert where.path == ROOT / "cases" and where.cwd == ROOT and where.env == {}
    assert f"--rootdir={ROOT}" in where.options and "-c" not in where.options
    assert where.options[where.options.index("-p") + 1] == "harness.run.pytest_plugin"


def test_an_installed_harness_runs_its_packaged_suite_from_the_current_directory(monkeypatch, tmp_path):
    package = tmp_path / "site-packages" / "harness"
    (package / "cases").mkdir(parents=True)
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.setattr(pytest_command, "PACKAGE", package)
    monkeypatch.chdir(here)
    where = pytest_command.suite()
    assert where.path == package / "cases" and where.cwd == here
    opts = where.options
    # no configuration file from around the venv, and no conftest.py above the suite
    assert opts[opts.index("-c") + 1] == os.devnull
    assert f"--rootdir={package / 'cases'}" in opts and f"--confcutdir={package / 'cases'}" in opts
    assert opts[opts.index("-p") + 1] == "harness.run.pytest_plugin"
    # `python -m pytest` in a project with a `harness` package of its own imports the installed one
    assert where.env == {"PYTHONSAFEPATH": "1"}


def test_check_writes_its_report_under_the_current_directory(monkeypatch, tmp_path):
    seen: dict = {}
    monkeypatch.setattr(check, "run_pytest", fake_pytest(seen))
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--backend", "torch_native", "--family", "decode", "--device", "cpu"]) == 0
    report = next(a for a in seen["cmd"] if a.startswith(str(tmp_path / "reports")))
    assert Path(report).parent == tmp_path / "reports"
    assert seen["cmd"][3] == str(pytest_command.suite().path)


def test_the_pytest11_entry_point_is_named_by_the_module_conftest_and_check_load():
    """pytest registers a plugin once per name: an entry point named by its module, the module that
    conftest.py's pytest_plugins and check's `-p` name, is loaded once in an editable checkout."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.entry-points.pytest11]\n")[1]
    entries = [line for line in section.split("\n\n")[0].splitlines() if not line.startswith("#")]
    assert entries == [f'"{pytest_command.PLUGIN}" = "{pytest_command.PLUGIN}"']
    conftest = {}
    exec((ROOT / "conftest.py").read_text(), conftest)
    assert conftest["pytest_plugins"] == [pytest_command.PLUGIN]
