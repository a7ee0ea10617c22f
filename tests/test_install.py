"""An installed harness: check runs the suite shipped in the package, writes its report
under the current directory, and loads the pytest plugin once. The install itself, a wheel in a new
venv run from outside the checkout, is .ci/install_check (CI runs it).

Its version: one release in pyproject.toml and the source, named in every report.

`make check`'s GPU set-up (harness/tools/gpu_setup.py and the Makefile): on a machine with a GPU it
installs the `gpu` extra or fails naming what it could not install, then says which CUDA backends
are available; on a CPU machine, with GPU=no, or offline (INSTALL=no) it installs nothing. The GPU
is a fake nvidia-smi on PATH, pip a fake script that logs what it was asked to install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import harness
from harness.backends.flash_attn_versions import FA4_RANGE
from harness.backends.flashinfer_versions import RANGE
from harness.cli import main
from harness.report import environment, html
from harness.run import check, pytest_command
from harness.tools import gpu_setup
from tests.report_helpers import sample_document

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




def test_the_source_version_is_pyproject_s():
    declared = re.search(r'(?m)^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text())
    assert declared and harness.SOURCE_VERSION == declared.group(1)


def test_the_version_comes_from_the_installed_distribution_else_from_the_source(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: {"attn-harness": "9.8.7"}[name])
    assert harness.installed_version() == "9.8.7"

    def absent(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", absent)
    assert harness.installed_version() == harness.SOURCE_VERSION


def test_results_json_environment_and_the_html_header_name_the_version(monkeypatch):
    monkeypatch.setattr(harness, "__version__", "9.8.7")
    assert environment.harness_version().startswith("9.8.7 (")
    doc = sample_document()
    doc["environment"]["attn-harness"] = environment.harness_version()
    header = html.render(doc).split("<nav>")[0]
    assert re.search(r'attn-harness <span id="version">9\.8\.7 \(', header)


def test_a_report_without_a_version_says_so():
    header = html.render(sample_document()).split("<nav>")[0]
    assert 'attn-harness <span id="version">unknown</span>' in header


REQUIRES = [
    "torch>=2.5",
    'flashinfer-python<0.8,>=0.6.16; extra == "gpu"',
    'flash-attn-4<4.0.0,>=4.0.0b26; extra == "gpu"',
    'ruff>=0.6; extra == "dev"',
]


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A PATH holding only what the test puts there; torch sees no CUDA; the project's gpu extra."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(gpu_setup.metadata, "requires", lambda dist: REQUIRES)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    return bin_dir


def fake_pip(tmp_path: Path, failing: str = "") -> tuple[list[str], Path]:
    """A pip that logs each requirement and fails (exit 3) for one whose name starts with `failing`."""
    log = tmp_path / "pip.log"
    fail = f'case "$3" in {failing}*) exit 3;; esac' if failing else ""
    return [str(script(tmp_path / "pip", f'echo "$3" >> {log}\n{fail}'))], log


def test_the_gpu_extra_is_the_supported_ranges():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert extra == [RANGE.spec, FA4_RANGE.spec]


def test_gpu_requirements_are_read_from_the_metadata():
    wanted = ["flashinfer-python<0.8,>=0.6.16", "flash-attn-4<4.0.0,>=4.0.0b26"]
    assert gpu_setup.gpu_requirements(REQUIRES) == wanted
    assert gpu_setup.gpu_requirements(None) == []


def test_a_gpu_is_what_nvidia_smi_lists_or_what_torch_sees(tmp_path):
    listing = script(tmp_path / "smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"')
    failing = script(tmp_path / "smi_fails", "exit 9")
    assert gpu_setup.gpu_present(str(listing), lambda: False)
    assert not gpu_setup.gpu_present(str(failing), lambda: False)
    assert gpu_setup.gpu_present(str(failing), lambda: True)
    assert not gpu_setup.gpu_present(None, lambda: False)


def test_on_a_gpu_machine_each_requirement_is_installed_and_the_backends_named(machine, tmp_path, capsys):
    script(machine / "nvidia-smi", 'echo "GPU 0: NVIDIA H100"')
    pip, log = fake_pip(tmp_path)
    assert gpu_setup.main(["--pip", *pip]) == 0
    assert log.read_text().split() == ["flashinfer-python<0.8,>=0.6.16", "flash-attn-4<4.0.0,>=4.0.0b26"]
    out = capsys.readouterr().out
    assert "gpu set-up: CUDA backends available: none" in out  # torch sees no CUDA in this test
    assert "gpu set-up:   flashinfer_paged unavailable: " in out


def test_a_failed_install_fails_the_set_up_naming_the_package(machine, tmp_path, capsys):
    script(machine / "nvidia-smi", 'echo "GPU 0: NVIDIA H100"')
    pip, log = fake_pip(tmp_path, failing="flash-attn-4")
    assert gpu_setup.main(["--pip", *pip]) == 1
    out = capsys.readouterr().out
    assert "could not install flash-attn-4<4.0.0,>=4.0.0b26 (pip exit 3)" in out
    assert "flashinfer-python" not in out.split("could not install")[1]  # the one that installed is not named
    assert "CUDA backends available" not in out


@pytest.mark.parametrize("gpu,smi", [("auto", None), ("no", 'echo "GPU 0: NVIDIA H100"')])
def test_without_a_gpu_or_with_gpu_no_nothing_is_installed(machine, tmp_path, capsys, gpu, smi):
    if smi:
        script(machine / "nvidia-smi", smi)
    pip, log = fake_pip(tmp_path)
    assert gpu_setup.main(["--gpu", gpu, "--pip", *pip]) == 0
    assert not log.exists()
    assert "the gpu extra (FlashInfer, flash-attn-4) is not installed" in capsys.readouterr().out


def make_n(*args: str) -> str:
    """The commands `make check` would run from a fresh checkout (-B: as if nothing were installed)."""
    cmd = ["make", "-n", "-B", "-C", str(ROOT), "check", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed here")
def test_the_makefile_runs_the_gpu_set_up_after_the_project_install_and_never_offline():
    lines = make_n().splitlines()
    setup = lines.index(".venv/bin/python -m harness.tools.gpu_setup --gpu auto")
    assert "pip install -q" in lines[setup - 1] and "-e '.[hf,dev]'" in lines[setup - 1]
    assert lines[setup + 1].startswith("touch")
    assert "--gpu no" in make_n("GPU=no")
    offline = make_n("INSTALL=no", f"PYTHON={sys.executable}")
    assert "pip" not in offline and "gpu_setup" not in offline
