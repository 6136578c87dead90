"""The editable install leaves nothing in the course folder that JupyterLab would show."""

import configparser
import importlib.metadata
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_setup_cfg_sends_the_egg_info_to_a_hidden_folder_that_a_clone_has():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    egg_base = config["egg_info"]["egg_base"]
    assert egg_base.startswith("."), "JupyterLab hides only dot-folders by default"
    # setuptools refuses an egg_base that does not exist, so a fresh clone must carry it.
    kept = REPO / egg_base / ".gitignore"
    assert kept.is_file() and "!.gitignore" in kept.read_text(encoding="utf-8")


def _installed_editable_from_here() -> bool:
    try:
        dist = importlib.metadata.distribution("gpt2lib")
    except importlib.metadata.PackageNotFoundError:
        return False
    direct_url = dist.read_text("direct_url.json")
    if not direct_url:
        return False
    info = json.loads(direct_url)
    return info.get("dir_info", {}).get("editable", False) and info["url"] == REPO.as_uri()


@pytest.mark.skipif(
    not _installed_editable_from_here(), reason="gpt2lib is not installed editable from this folder"
)
def test_the_editable_install_left_no_egg_info_in_the_course_folder():
    assert [p.name for p in REPO.glob("*.egg-info")] == []
