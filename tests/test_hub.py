"""Checkpoints by their Hugging Face name (hf.checkpoint_dir): `--actor org/name[@revision]` from a hub cache
built here in the layout `hf download` writes (refs/, snapshots/ linking into blobs/), holding a tiny random
Qwen2 with SmolLM2's real tokenizer. Offline and absent, one line naming the fetch command; a local directory
wins over a name; online, a cached name opens no connection. Nothing is downloaded: every socket connection is
refused and recorded where the hub would be asked."""
import hashlib
import json
import os
import shutil
import socket

import pytest
import torch
from safetensors.torch import load_file

import bench
import embedder
import hf
import train
from test_train import FAST, _torchrun, read_metrics

REPO = "org/tiny-qwen2"
MAIN, OTHER = "a" * 40, "b" * 40     # commit hashes: refs/main -> MAIN; refs/v2 and OTHER's snapshot -> OTHER
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub cache holding REPO at two commits: HF_HUB_CACHE's layout, files as links into blobs/."""
    root = tmp_path_factory.mktemp("hf") / "hub"
    src = str(root.parent / "src")
    bench._random_checkpoint(dict(bench.SMALL, vocab_size=49152), src)   # SmolLM2's vocabulary
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(hf.checkpoint_dir("smollm2"), name), src)
    repo = root / f"models--{REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "blobs").mkdir()
    for commit in (MAIN, OTHER):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in os.listdir(src):
            data = open(os.path.join(src, name), "rb").read()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, snap), snap / name)
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v2").write_text(OTHER)
    return root


@pytest.fixture
def cache(hub, monkeypatch):
    """HF_HUB_CACHE -> the built cache, offline; huggingface_hub reads its environment once, at import, so its
    constants are pointed there too."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def snapshot(hub, commit):
    return str(hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit)


def test_a_hub_name_trains_from_its_snapshot(cache, tmp_path):
    out = str(tmp_path / "run")
    train.main(["--tasks", "room", "--mode", "grpo", "--actor", REPO, "--iters", "1", "--out", out,
                "--max-reply-tokens", "8", *FAST, "--eval-every", "0"])
    assert [r["step"] for r in read_metrics(out)] == [0]
    # the run started from the snapshot's weights (bf16 there; one GRPO step at lr 1e-6 moves none by 1e-4;
    # a model of another init differs by ~0.02) and its tokenizer
    ref, trained = (load_file(os.path.join(d, "model.safetensors")) for d in (snapshot(cache, MAIN),
                                                                            os.path.join(out, "ckpt", "actor")))
    assert ref.keys() == trained.keys() and all(torch.allclose(ref[k].float(), trained[k], atol=1e-4) for k in ref)
    vocab = [json.load(open(os.path.join(d, "tokenizer.json")))["model"]["vocab"]
             for d in (snapshot(cache, MAIN), os.path.join(out, "ckpt", "actor"))]
    assert vocab[0] == vocab[1] and len(vocab[0]) == 49152


def test_a_revision_resolves_to_its_snapshot(cache):
    assert hf.checkpoint_dir(REPO) == snapshot(cache, MAIN)
    assert hf.checkpoint_dir(f"{REPO}@{OTHER}") == snapshot(cache, OTHER)   # a commit
    assert hf.checkpoint_dir(f"{REPO}@v2") == snapshot(cache, OTHER)        # a branch, through refs/v2
    assert str(embedder.Embedder(f"{REPO}@v2").path) == snapshot(cache, OTHER)   # --embedder takes a name too


def test_an_absent_name_offline_is_one_line_naming_the_fetch(cache, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"HF_HUB_OFFLINE is set: fetch it with `hf download org/absent "
                                                r"--revision v9`$") as err:
        hf.checkpoint_dir("org/absent@v9")
    assert "\n" not in str(err.value)
    with pytest.raises(SystemExit, match=r"^error: .*fetch it with `hf download org/absent`$") as stop:
        train.main(["--tasks", "room", "--actor", "org/absent", "--out", str(tmp_path / "run")])
    assert "\n" not in str(stop.value.code)
    with pytest.raises(SystemExit, match=r"^error: cannot load the embedder: .*`hf download org/absent`$"):
        train.build_manager(train.parse_args(["--embedder", "org/absent"]), None, "cpu", None)


def test_two_ranks_train_from_a_hub_name(cache, tmp_path):
    """Under torchrun each rank resolves the name itself, in a fresh process that finds the cache through
    HF_HUB_CACHE alone; a rank that could not would stop the run."""
    out = str(tmp_path / "run")
    _torchrun("--tasks", "room", "--mode", "grpo", "--actor", REPO, "--iters", "1", "--out", out,
              "--max-reply-tokens", "8", *FAST, "--eval-every", "0", worker=os.path.join("..", "train.py"))
    assert [r["step"] for r in read_metrics(out)] == [0]


def test_a_local_directory_wins_over_a_hub_name(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs(REPO)
    assert hf.checkpoint_dir(REPO) == REPO


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connection refused and recorded: huggingface_hub's HTTP client opens its connections
    through socket.create_connection."""
    tried = []

    def refuse(address, *args, **kw):
        tried.append(address)
        raise ConnectionRefusedError(f"no network in tests ({address})")
    monkeypatch.setattr(socket, "create_connection", refuse)
    return tried


def test_online_a_cached_name_asks_nothing_and_an_absent_one_is_fetched(cache, no_network, monkeypatch, capsys):
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hf.checkpoint_dir(REPO) == snapshot(cache, MAIN) and not no_network
    with pytest.raises(FileNotFoundError, match=r"could not be downloaded .*`hf download org/absent`$") as err:
        hf.checkpoint_dir("org/absent")
    assert no_network and "\n" not in str(err.value)   # it asked the hub, and only because it was absent
    assert "downloading org/absent" in capsys.readouterr().out
