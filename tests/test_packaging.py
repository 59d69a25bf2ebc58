"""Install from a wheel (issue 27, item 4): `python -m build` makes a wheel and an sdist that carry the shipped
rules, the report templates, the store migrations and the data files; the wheel, installed into a fresh venv
(not editable, outside the checkout), answers `gpufinops rules check` and `gpufinops demo --quick`, and the
Dockerfile's ENTRYPOINT + CMD is a command of the installed console script.

Slow (a build and an install, about a minute): marked `packaging`, kept in the suite. The full install with
its dependencies from the registry is .ci/run's step after the tests; here the fresh venv borrows the test
venv's dependencies through a .pth line (not the gpufinops of the checkout: that one is an editable finder the
fresh venv does not load, and the test asserts where gpufinops is imported from)."""

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]

# Under the wheel's <name>.data/data/ (pyproject data-files) or inside the package (package-data).
WHEEL_MUST_HOLD = [
    "gpufinops-0.1.0.data/data/share/gpufinops/rules/idle-shutdown.yaml",
    "gpufinops-0.1.0.data/data/share/gpufinops/rules/zero-activity.yaml",
    "gpufinops-0.1.0.data/data/share/gpufinops/rules/examples/common-40pct-10min.yaml",
    "gpufinops-0.1.0.data/data/share/gpufinops/reports/monthly_audit.html.j2",
    "gpufinops/store/migrations/env.py",
    "gpufinops/store/migrations/script.py.mako",
    "gpufinops/data/demo_trace_gentd26.csv.gz",
    "gpufinops/data/aws_gpu_ondemand_prices.csv",
    "gpufinops/data/catalog/instances.csv",
]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # Isolated, as CI and a person building a release run it; the build's own temp tree, not the checkout.
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("gpufinops-*.whl")
    (sdist,) = out.glob("gpufinops-*.tar.gz")
    return wheel, sdist


def test_wheel_carries_rules_templates_migrations_and_data(dist):
    wheel, _ = dist
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in WHEEL_MUST_HOLD if n not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    versions = sorted(p.name for p in (ROOT / "gpufinops" / "store" / "migrations" / "versions").glob("*.py"))
    assert versions and all(f"gpufinops/store/migrations/versions/{v}" in names for v in versions)
    shipped_rules = sorted(p.name for p in (ROOT / "rules").glob("*.yaml"))
    assert all(f"gpufinops-0.1.0.data/data/share/gpufinops/rules/{r}" in names for r in shipped_rules)
    entry_points = zipfile.ZipFile(wheel).read("gpufinops-0.1.0.dist-info/entry_points.txt").decode()
    assert "gpufinops = gpufinops.cli:main" in entry_points
    assert not any(n.startswith("tests/") for n in names)


def test_sdist_carries_what_the_wheel_is_built_from(dist):
    _, sdist = dist
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for need in ("pyproject.toml", "README.md", "rules/idle-shutdown.yaml", "rules/examples/common-40pct-10min.yaml",
                 "reports/monthly_audit.html.j2", "gpufinops/store/migrations/env.py",
                 "gpufinops/store/migrations/versions/0001_baseline.py", "gpufinops/data/demo_trace_gentd26.csv.gz"):
        assert need in names, f"{need} not in {sdist.name}"


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory):
    """The wheel installed (not editable) into a fresh venv; dependencies borrowed from the test venv."""
    wheel, _ = dist
    home = tmp_path_factory.mktemp("venv")
    env_dir = home / "v"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir, home


def _run(installed, *args, timeout=300):
    env_dir, home = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFINOPS_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(list(args), cwd=home, env=env, capture_output=True, text=True, timeout=timeout)


def test_installed_wheel_is_not_the_checkout_and_finds_its_shipped_files(installed):
    env_dir, _ = installed
    proc = _run(installed, str(env_dir / "bin" / "python"), "-c",
                "import json, gpufinops, gpufinops.config as c; print(json.dumps([gpufinops.__file__, "
                "str(c.DEFAULT_RULES_DIR), str(c.REPORTS_DIR)]))")
    assert proc.returncode == 0, proc.stderr
    package, rules, reports = json.loads(proc.stdout)
    assert Path(package).is_relative_to(env_dir) and not Path(package).is_relative_to(ROOT)
    assert Path(rules) == env_dir / "share" / "gpufinops" / "rules" and (Path(rules) / "idle-shutdown.yaml").is_file()
    assert (Path(reports) / "monthly_audit.html.j2").is_file()


def test_installed_wheel_checks_the_shipped_rules(installed):
    proc = _run(installed, "gpufinops", "rules", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "idle-shutdown.yaml" in proc.stdout or "gpu-util-below-10pct-2h" in proc.stdout


def test_installed_wheel_runs_the_quick_demo(installed):
    proc = _run(installed, "gpufinops", "demo", "--quick")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Stopped idle GPU instance" in proc.stdout and "common rule" in proc.stdout


def dockerfile_command(path: Path) -> tuple[list[str], list[str]]:
    """The last stage's ENTRYPOINT and CMD of a Dockerfile, in exec (JSON) form."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
        if m:
            found[m.group(1)] = json.loads(m.group(2))
    return found["ENTRYPOINT"], found.get("CMD", [])


def test_the_images_entrypoint_is_a_command_of_the_installed_wheel(installed):
    """The image was not built here (no Docker engine on this machine): its ENTRYPOINT and CMD are run as the
    plain command they are, against the console script the wheel installed (CMD `serve` with --help: it
    would otherwise serve until stopped)."""
    entrypoint, cmd = dockerfile_command(ROOT / "deploy" / "Dockerfile")
    assert entrypoint == ["gpufinops"] and cmd == ["serve"]
    proc = _run(installed, *entrypoint, *cmd, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpufinops serve" in proc.stdout
    proc = _run(installed, *entrypoint, "--help")
    assert proc.returncode == 0 and "demo" in proc.stdout
