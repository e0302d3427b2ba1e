"""make install's installer (tools/install.py): uv gets the package sources pip is configured
with. The install itself runs in every fresh clone (make test, .ci/run)."""

from __future__ import annotations

from tools import install


def test_pip_configuration_is_read_with_pips_precedence(tmp_path, monkeypatch):
    """pip install's own rule: [global], then [install], then PIP_* variables, a later value
    replacing the whole of an earlier one; another command's section does not apply."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///a/simple file:///b/simple\n"
                    "constraint = /c/constraints.txt\nindex-url = file:///global\n"
                    "find-links = /global-wheels\n"
                    "[install]\nno-index = false\nindex-url = file:///install\n"
                    "find-links = /install-wheels /more-wheels\n"
                    "[download]\nconstraint = /download-only.txt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", "/env-wheels")
    config = install.pip_config()
    assert config["extra-index-url"] == ["file:///a/simple", "file:///b/simple"]
    assert config["constraint"] == ["/c/constraints.txt"]
    assert config["index-url"] == ["file:///install"]
    assert config["find-links"] == ["/env-wheels"]
    assert config["no-index"] == ["false"]
    monkeypatch.setenv("PIP_INDEX_URL", "file:///env")
    assert install.pip_config()["index-url"] == ["file:///env"]


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
