"""Advice that names an install command says the one that works where it is printed."""

from __future__ import annotations

from pathlib import Path

from stagevisor.supervisor import install


def test_in_the_checkout_itself_the_advice_is_an_editable_install_of_dot(monkeypatch):
    root = install.checkout_root()
    assert root is not None and (root / "pyproject.toml").is_file()  # the tests run from a checkout
    monkeypatch.chdir(root)
    assert install.install_command("demo") == "pip install -e '.[demo]'"


def test_elsewhere_the_advice_names_the_checkout_by_its_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert install.install_command("ray") == f"pip install -e '{install.checkout_root()}[ray]'"


def test_an_installed_package_is_named_by_its_distribution(monkeypatch, tmp_path):
    site = tmp_path / "site-packages" / "stagevisor" / "supervisor"
    site.mkdir(parents=True)
    monkeypatch.setattr(install, "__file__", str(site / "install.py"))
    assert install.checkout_root() is None
    assert install.install_command("demo") == "pip install 'stagevisor[demo]'"


def test_a_removed_working_directory_still_gets_advice(monkeypatch):
    def gone() -> str:
        raise FileNotFoundError("cwd")

    monkeypatch.setattr(install.os, "getcwd", gone)
    assert install.install_command("bench") == f"pip install -e '{install.checkout_root()}[bench]'"
    assert Path(install.checkout_root() or "").is_dir()
