"""make install's installer (tools/install.py): uv gets the package sources pip is configured
with. The install itself runs in every fresh clone (make test, .ci/run)."""

from __future__ import annotations

from tools import install


def test_pip_configuration_files_and_variables_are_read_with_every_value(tmp_path, monkeypatch):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///a/simple file:///b/simple\n"
                    "constraint = /c/constraints.txt\n[install]\nno-index = false\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    config = install.pip_config()
    assert config["extra-index-url"][-2:] == ["file:///a/simple", "file:///b/simple"]
    assert "/c/constraints.txt" in config["constraint"] and "/wheels" in config["find-links"]
    assert config["no-index"] == ["false"]


def test_each_source_becomes_its_uv_option_with_pips_index_rule():
    config = {"extra-index-url": ["file:///a/simple", "file:///b/simple"],
              "find-links": ["/wheels"], "constraint": ["/c.txt"], "cert": ["/ca.crt"],
              "default-timeout": ["180"], "no-index": ["false"]}
    assert install.uv_arguments(config) == [
        "--index-strategy", "unsafe-best-match", "--compile-bytecode",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/wheels", "--constraint", "/c.txt"]
    assert install.uv_arguments({"no-index": ["true"], "index-url": ["file:///i"]})[-3:] == [
        "--index-url", "file:///i", "--no-index"]
