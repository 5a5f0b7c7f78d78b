"""sparkdl.storage and sparkdl.run_output: local paths, file:// URIs and a real S3-compatible
server (moto's, started by the s3_server fixture), plus checkpoints and --conf on S3."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from sparkdl import storage
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.run_output import RunOutput


def test_resolve_local_and_file_uri(tmp_path: Path) -> None:
    fs, path = storage.resolve(str(tmp_path / "a"))
    assert fs.type_name == "local" and path == str(tmp_path / "a")
    fs, path = storage.resolve((tmp_path / "a").as_uri())
    assert fs.type_name == "local" and path == str(tmp_path / "a")
    assert storage.renames_atomically(fs)
    assert storage.local_path((tmp_path / "a").as_uri()) == tmp_path / "a"
    assert storage.local_path("s3://bucket/a") is None


def test_odd_directory_names_mean_the_same_directory_to_pyarrow_and_to_spark(
        tmp_path: Path) -> None:
    odd = tmp_path / "my runs%20 #1?x"
    uri = storage.as_uri(str(odd))
    assert storage.local_path(uri) == odd
    assert storage.resolve(uri)[1] == str(odd)
    assert storage.spark_uri(uri) == f"file://{odd}"  # Hadoop's Path reads it literally
    assert storage.spark_uri(str(odd)) == f"file://{odd}"
    assert storage.spark_uri("s3://bucket/my%20runs/a%23b") == "s3://bucket/my runs/a#b"


def _spellings(path: Path) -> list[str]:
    return [str(path), f"file:{path}", f"file://{path}", path.as_uri(), f"file://localhost{path}"]


def test_every_spelling_of_a_local_directory_means_the_same_place(tmp_path: Path) -> None:
    target = tmp_path / "d"
    for spelling in _spellings(target):
        assert storage.local_path(spelling) == target, spelling
        assert storage.as_uri(spelling) == target.as_uri(), spelling
        fs, path = storage.resolve(spelling)
        assert (fs.type_name, path) == ("local", str(target)), spelling
    assert storage.as_uri("s3://bucket/a") == "s3://bucket/a"


def test_output_dir_and_data_dir_read_file_uris_alike(tmp_path: Path, monkeypatch) -> None:
    from sparkdl.config import load_config
    from sparkdl.preflight import preflight
    from sparkdl.stages import shard_uris

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "run"
    for spelling in _spellings(target):
        config = load_config(data={"data": {"dir": spelling}, "output": {"dir": spelling}})
        assert shard_uris(config) == (f"{target.as_uri()}/train", f"{target.as_uri()}/test")
        preflight(config, "evaluate")
        with RunOutput(config.output.dir) as out:
            assert out.dir == target, spelling
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no ./file:/... directory


def test_a_config_file_is_found_by_any_spelling(tmp_path: Path) -> None:
    from sparkdl.config import load_config

    conf = tmp_path / "job.yaml"
    conf.write_text("training:\n  epochs: 3\n")
    for spelling in _spellings(conf):
        assert load_config(spelling).training.epochs == 3, spelling


def test_unknown_scheme_names_the_uri() -> None:
    with pytest.raises(DataError, match=r"nosuchscheme://x/y"):
        storage.resolve("nosuchscheme://x/y")


def test_write_read_upload_download_local(tmp_path: Path) -> None:
    fs, root = storage.resolve(tmp_path.as_uri())
    storage.write_bytes(fs, f"{root}/f.bin", b"one")
    storage.write_bytes(fs, f"{root}/f.bin", b"two")  # replaced whole
    assert storage.read_bytes((tmp_path / "f.bin").as_uri()) == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no temporary left
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("x")
    storage.upload(src, (tmp_path / "dst").as_uri())
    storage.download((tmp_path / "dst").as_uri(), tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "x.txt").read_text() == "x"
    with pytest.raises(DataError, match=r"file .*missing\.txt does not exist"):
        storage.read_bytes((tmp_path / "missing.txt").as_uri())


def test_run_output_local_is_used_in_place(tmp_path: Path) -> None:
    with RunOutput(str(tmp_path / "run")) as out:
        assert not out.remote and out.dir == tmp_path / "run" and out.dir.is_dir()
        assert out.location("m.keras") == str(tmp_path / "run" / "m.keras")
        assert out.fetch("m.keras") is None
    assert (tmp_path / "run").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match=r"output\.dir: .*file cannot be a directory"):
        RunOutput(str(tmp_path / "file"))


def test_s3_round_trip(s3_bucket: str, tmp_path: Path) -> None:
    fs, root = storage.resolve(f"{s3_bucket}/run")
    assert fs.type_name == "s3" and not storage.renames_atomically(fs)
    storage.make_dirs(f"{s3_bucket}/run", key="output.dir")
    storage.write_bytes(fs, f"{root}/a.json", b"{}")
    assert storage.read_bytes(f"{s3_bucket}/run/a.json") == b"{}"
    assert storage.exists(f"{s3_bucket}/run/a.json")
    storage.delete(f"{s3_bucket}/run/a.json")
    assert not storage.exists(f"{s3_bucket}/run/a.json")


def test_s3_missing_bucket_is_one_error_naming_it(s3_server: str) -> None:
    with pytest.raises(DataError, match=r"output\.dir: cannot create s3://no-such-bucket/run"):
        RunOutput("s3://no-such-bucket/run")


def test_run_output_on_s3_publishes_marker_last(s3_bucket: str) -> None:
    uri = f"{s3_bucket}/runs/r1"
    with RunOutput(uri) as out:
        assert out.remote and out.dir.name == "r1"
        (out.staging / "metrics.json").write_text('{"a": 1}')
        out.publish_unit(["metrics.json"])
        assert out.location("metrics.json") == f"{uri}/metrics.json"
        preds = out.dir / "predictions"
        preds.mkdir()
        (preds / "part-0.parquet").write_bytes(b"p")
        (preds / "_marker.json").write_text("{}")
        out.publish_dir("predictions", marker="_marker.json")
        staging = out.dir
    assert not staging.exists()  # the staging directory is removed
    fs, root = storage.resolve(uri)
    names = sorted(i.path[len(root) + 1:] for i in
                   fs.get_file_info(pafs.FileSelector(root, recursive=True))
                   if i.type == pafs.FileType.File)
    assert names == ["metrics.json", "predictions/_marker.json", "predictions/part-0.parquet"]
    with RunOutput(uri) as again:  # a later stage reads what an earlier one published
        fetched = again.fetch("metrics.json")
        assert fetched is not None and json.loads(fetched.read_text()) == {"a": 1}
        assert again.fetch("nothing.json") is None


def test_checkpoints_on_s3_resume(s3_bucket: str, tmp_path) -> None:
    import numpy as np

    from sparkdl.training.worker.checkpoint import CheckpointStore, TrainingState

    uri = f"{s3_bucket}/ckpt"
    store = CheckpointStore(uri)
    run_id = store.start_run(resume=False)
    for step in (3, 6, 9):
        store.save_worker_state(run_id, step, 1, {"residual": np.arange(5.0) * step,
                                                  "tau": 0.5 * step})
        model = tmp_path / f"model-{step}.keras"
        model.write_bytes(b"model-%d" % step)
        store.save(TrainingState(run_id, step, step // 3, 0, [{"loss": 1.0 / step}]),
                   model, keep=2)
    again = CheckpointStore(uri)
    assert again.start_run(resume=True) == run_id
    latest = again.latest(run_id)
    assert latest is not None and latest.state.global_step == 9
    with latest.model_file() as model_file:  # downloaded from the object store
        assert model_file.read_bytes() == b"model-9"
    state = latest.worker_state(again, 1)
    assert state["tau"] == 4.5 and np.array_equal(state["residual"], np.arange(5.0) * 9)
    assert latest.worker_state(again, 0) is None
    fs, root = storage.resolve(uri)
    # a checkpoint without state.json (a writer killed mid-way) is never read, then removed
    fs.create_dir(f"{root}/ckpt-0000000012")
    storage.write_bytes(fs, f"{root}/ckpt-0000000012/model.keras", b"half")
    assert again.latest(run_id).state.global_step == 9
    CheckpointStore(uri).start_run(resume=True)
    dirs = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(root))
                  if i.type == pafs.FileType.Directory)
    assert dirs == ["ckpt-0000000006", "ckpt-0000000009"]


def test_conf_from_s3(s3_bucket: str) -> None:
    from sparkdl.config import load_config

    fs, root = storage.resolve(s3_bucket)
    storage.write_bytes(fs, f"{root}/job.yaml", b"training:\n  epochs: 3\n")
    assert load_config(f"{s3_bucket}/job.yaml").training.epochs == 3
    with pytest.raises(ConfigurationError, match=r"configuration file s3://.*/none\.yaml"):
        load_config(f"{s3_bucket}/none.yaml")


def test_configure_s3_sets_the_endpoint_that_tasks_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv(storage.S3_ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(storage.S3_REGION_ENV, raising=False)
    storage.configure_s3("http://minio:9000", None)
    assert os.environ[storage.S3_ENDPOINT_ENV] == "http://minio:9000"
    shipped = storage.s3_environment()
    assert shipped == {storage.S3_ENDPOINT_ENV: "http://minio:9000"}
    monkeypatch.setenv(storage.S3_ENDPOINT_ENV, "http://elsewhere:9000")  # a task's own
    storage.apply_environment(shipped)
    assert os.environ[storage.S3_ENDPOINT_ENV] == "http://minio:9000"


def test_shards_on_s3_read_by_sparkdls_reader(s3_bucket: str, tmp_path: Path) -> None:
    """Shards copied to S3 are read there by the workers' pyarrow reader (only Spark's own
    reading and writing of shards needs Hadoop's s3a)."""
    import numpy as np
    from test_data_reader import make_shards

    from sparkdl.data.files import read_metadata
    from sparkdl.data.reader import read_all

    local, _ = make_shards(tmp_path / "shards", [[4, 3], [5]])
    storage.upload(local, f"{s3_bucket}/shards")
    metadata = read_metadata(f"{s3_bucket}/shards")  # footers checked on S3
    x, y = read_all(f"{s3_bucket}/shards", metadata)
    lx, ly = read_all(local)
    np.testing.assert_array_equal(x, lx)
    np.testing.assert_array_equal(y, ly)


def test_a_failed_upload_leaves_no_temporary_file(tmp_path: Path) -> None:
    source = tmp_path / "model.keras"
    source.write_bytes(b"weights")
    dest = tmp_path / "out"
    (dest / "model.keras").mkdir(parents=True)  # a directory where the file should go
    (dest / "model.keras" / "keep").write_text("user's")
    with pytest.raises(DataError, match=r"cannot write .*out/model\.keras"):
        storage.upload(source, str(dest / "model.keras"))
    assert sorted(p.name for p in dest.iterdir()) == ["model.keras"]
    assert sorted(p.name for p in (dest / "model.keras").iterdir()) == ["keep"]
