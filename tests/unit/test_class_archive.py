"""The driver JVM's class archive: when it is written, when mapped, when left alone.

A real JVM writes and maps it in tests/integration/test_session_output.py; these check the
choice of options around the files, including the states a killed writer leaves."""

from __future__ import annotations

import os
import time

import pytest

from sparkdl import class_archive

HEADER = b"\xa8\xab\x0b\xf0" + bytes(60)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_first_jvm_writes_the_archive_and_the_next_ones_map_it(cache):
    path = class_archive.archive_path()
    assert path is not None and path.parent == cache
    assert class_archive.driver_options("-Xss4m") == (
        f"-Xss4m -XX:ArchiveClassesAtExit={path} -Xlog:cds=off -Xlog:cds+dynamic=off")
    # while that JVM runs (its marker fresh, no archive yet), others start without one
    assert class_archive.driver_options("-Xss4m") == "-Xss4m"
    path.write_bytes(HEADER)  # what the JVM leaves at exit: the header written last
    assert class_archive.driver_options(None) == (
        f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off")
    assert not path.with_name(path.name + ".writing").exists()


def test_an_archive_cut_short_is_written_anew_once_its_writer_is_given_up(cache):
    path = class_archive.archive_path()
    assert "ArchiveClassesAtExit" in class_archive.driver_options(None)
    path.write_bytes(bytes(64))  # no header: the writer was killed
    assert class_archive.driver_options(None) == ""
    marker = path.with_name(path.name + ".writing")
    old = time.time() - 3600
    os.utime(marker, (old, old))
    assert "ArchiveClassesAtExit" in class_archive.driver_options(None)
    assert not path.exists()  # the headerless file is gone before the new writer starts


def test_the_key_follows_the_classpath_settings(cache, monkeypatch):
    plain = class_archive.archive_path()
    assert class_archive.archive_path({"spark.jars": "/opt/extra.jar"}) != plain
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")
    assert class_archive.archive_path() != plain


@pytest.mark.parametrize("mine", ["-Xshare:off", "-XX:SharedArchiveFile=/opt/mine.jsa",
                                  "-XX:ArchiveClassesAtExit=/tmp/mine.jsa -Xss4m"])
def test_a_users_own_class_sharing_choice_is_kept(cache, mine):
    assert class_archive.driver_options(mine) == mine
    assert not cache.exists()


def test_no_archive_with_a_non_empty_directory_on_the_classpath(cache, tmp_path, monkeypatch):
    """The JVM refuses to archive such a classpath, and says so on stderr as it exits."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert class_archive.driver_options("-Xss4m") == "-Xss4m"
    (conf / "spark-defaults.conf").unlink()
    classes = tmp_path / "classes"
    classes.mkdir()
    (classes / "Mine.class").write_bytes(b"")
    extra = {"spark.driver.extraClassPath": f"/opt/a.jar:{classes}"}
    assert class_archive.driver_options("-Xss4m", extra) == "-Xss4m"
    assert "ArchiveClassesAtExit" in class_archive.driver_options(None)  # empty: archived


def test_a_cache_path_the_options_string_would_split_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDL_CACHE_DIR", str(tmp_path / "my cache"))
    assert class_archive.driver_options("-Xss4m") == "-Xss4m"


def test_an_unwritable_cache_directory_means_no_archive(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("SPARKDL_CACHE_DIR", str(blocked / "cache"))
    assert class_archive.driver_options("-Xss4m") == "-Xss4m"


def test_the_cache_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARKDL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert class_archive.cache_dir() == tmp_path / "sparkdl"
