"""What a user of the planner sees: the verdict first within 80 columns, `--wide`, colour
only on a terminal, `keras-mha gpus`, several devices on the command line, the checkpoint's
exact tensor bytes (local folders written by transformers, and through a Hub), and the
hostile-input leftovers (named pipes, Hub timeouts from the environment, HTML in a config,
new-user messages)."""

import io
import json
import os
import re
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha import cli
from keras_mha.commands import terminal
from keras_mha.hub.bundled import list_bundled
from keras_mha.hub.config import load_config
from keras_mha.hub.weights_size import checkpoint_size, checkpoint_size_of_folder
from keras_mha.planning.planner import memory
from keras_mha.planning.planner.quantization import checkpoint_format
from keras_mha.planning.spec import from_config
from tests.cli.test_inspect import run_cli
from tests.hub_server import hub_environment

pytestmark = pytest.mark.backend_independent

LLAMA_3 = "bundled:meta-llama/Meta-Llama-3-8B"


# -- 80 columns, verdict first ------------------------------------------------------------------


def test_every_bundled_report_fits_80_columns_and_markdown_prose_100(capsys):
    for repo_id in list_bundled():
        exit_code, out, err = run_cli(capsys, "inspect", f"bundled:{repo_id}", "--gpu", "2xH100")
        assert exit_code == 0, err
        lines = out.splitlines()
        assert max(map(len, lines)) <= 80, (repo_id, max(lines, key=len))
        assert lines[2].startswith("note:") or lines[2].startswith("serving "), repo_id
    exit_code, out, _ = run_cli(capsys, "inspect", "bundled:deepseek-ai/DeepSeek-V3",
                                "--gpu", "8xH200", "--format", "markdown")  # fmt: skip
    prose = [line for line in out.splitlines() if not line.startswith(("|", "<sub>"))]
    assert exit_code == 0 and max(map(len, prose)) <= 100
    exit_code, out, _ = run_cli(capsys, "inspect", LLAMA_3, "--gpu", "H100", "--wide")
    assert exit_code == 0 and max(map(len, out.splitlines())) > 80  # --wide: whole lines


def test_compare_fits_80_columns_with_a_verdict_per_model(capsys):
    models = [f"bundled:{name}" for name in ("meta-llama/Llama-2-7b-hf",
              "meta-llama/Meta-Llama-3-8B", "mistralai/Mistral-7B-v0.1",
              "meta-llama/Llama-3.1-70B")]  # fmt: skip
    exit_code, out, _ = run_cli(capsys, "compare", *models, "--gpu", "2xL40S")
    lines = out.splitlines()
    assert exit_code == 0 and max(map(len, lines)) <= 80
    assert "3 of 4 models fit for serving" in " ".join(line.strip() for line in lines[:3])
    fits_rows = [line.split() for line in lines if line.startswith("serving fits")]
    assert [row[2:] for row in fits_rows] == [["yes", "yes"], ["yes", "no", "(weights)"]]
    verdicts = " ".join(lines)
    assert "meta-llama/Llama-3.1-70B: serving does not fit" in verdicts
    exit_code, out, _ = run_cli(capsys, "compare", *models[:2], "--gpu", "L4", "--format", "json")
    comparison = json.loads(out)
    assert all("verdict" in report["fits"] for report in comparison["models"])
    assert comparison["models"][0]["fits"]["gpu_memory_source"] == "published nvidia-smi figure"


def test_compare_offline_says_the_configs_came_from_bundled_snapshots(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    exit_code, out, _ = run_cli(
        capsys, "compare", "meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "--offline"
    )
    assert exit_code == 0
    assert "note: offline mode is on" in out and "bundled snapshot" in out


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    assert terminal.use_colour(Terminal()) and not terminal.use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not terminal.use_colour(Terminal())
    monkeypatch.delenv("NO_COLOR")
    stream = Terminal()
    monkeypatch.setattr("sys.stdout", stream)
    terminal.write_report("model\n=====\nserving fits: yes, up to 8 tokens", colour=True)
    assert "\x1b[" in stream.getvalue() and "serving fits: yes" in stream.getvalue()
    assert terminal.line_style("serving does not fit: ...", 2) == "bold red"
    assert terminal.report_width(wide=False, stream=io.StringIO()) == 80


def test_gpus_lists_the_table_in_every_format(capsys):
    exit_code, out, _ = run_cli(capsys, "gpus")
    assert exit_code == 0 and max(map(len, out.splitlines())) <= 80
    assert "TPU v5e 16GB" in out and "3.35 TB/s" in out
    exit_code, out, _ = run_cli(capsys, "gpus", "--format", "json")
    rows = json.loads(out)
    assert {"bandwidth_bytes_per_s", "dense_16bit_flops", "dense_fp8_flops", "spec_source"} <= set(
        rows[0]
    )
    exit_code, out, _ = run_cli(capsys, "gpus", "--format", "markdown")
    assert exit_code == 0 and "| H100 80GB SXM |" in out and "datasheet" in out
    exit_code, out, _ = run_cli(capsys, "cards", "--help")
    assert exit_code == 0 and "bundled with keras-mha" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--gpu", "2xH100", "--format", "json"], 2),
        (["--gpu", "H100x4", "--format", "json"], 4),
        (["--gpu", "H100", "--gpus", "8", "--pipeline-parallel", "2", "--format", "json"], 8),
        (["--memory", "2x24GiB", "--format", "json"], 2),
    ],
)
def test_several_devices_on_the_command_line(capsys, argv, expected):
    exit_code, out, err = run_cli(capsys, "inspect", "bundled:meta-llama/Llama-3.1-70B", *argv)
    assert exit_code == 0, err
    fits = json.loads(out)["fits"]
    assert fits["devices"]["count"] == expected
    tensor, stages = fits["devices"]["tensor_parallel"], fits["devices"]["pipeline_parallel"]
    assert tensor * stages == expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--gpus", "2"], "--gpus needs the devices named"),
        (["--gpu", "H100", "--memory-utilization", "0"], "--memory-utilization"),
        (["--gpu", "H100", "--gpus", "0"], "--gpus"),
        (["--gpu", "H100", "--pipeline-parallel", "3"], "does not divide the 1 devices"),
    ],
)
def test_bad_device_flags_exit_2_naming_the_flag(capsys, argv, expected):
    exit_code, out, err = run_cli(capsys, "inspect", LLAMA_3, *argv)
    assert exit_code == 2 and out == "" and err.count("\n") == 1 and expected in err, err


# -- exact tensor bytes ---------------------------------------------------------------------

# Tiny checkpoints written by transformers: config class, arguments, model class, dtype.
CHECKPOINTS = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 2, "tie_word_embeddings": False},
              "LlamaForCausalLM", "bfloat16"),
    "qwen2-biases-tied": ("Qwen2Config", {"num_key_value_heads": 2, "tie_word_embeddings": True},
                          "Qwen2ForCausalLM", "bfloat16"),
    "mixtral-moe": ("MixtralConfig", {"num_key_value_heads": 2, "num_local_experts": 4,
                                      "num_experts_per_tok": 2}, "MixtralForCausalLM",
                    "float16"),
    "gemma2": ("Gemma2Config", {"num_key_value_heads": 2, "head_dim": 16}, "Gemma2ForCausalLM",
               "bfloat16"),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64},
             "GPT2LMHeadModel", "float32"),
    "bert": ("BertConfig", {"max_position_embeddings": 64}, "BertModel", "float32"),
}  # fmt: skip
SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 96, "vocab_size": 128}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folders = {}
    for name, (config_class, arguments, model_class, dtype) in CHECKPOINTS.items():
        extra = {} if name == "gpt2" else SMALL
        config = getattr(transformers, config_class)(**{**extra, **arguments, "vocab_size": 128})
        model = getattr(transformers, model_class)(config).to(getattr(torch, dtype))
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        folders[name] = folder
    return folders


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_computed_weights_are_the_checkpoints_tensor_bytes(checkpoints, name):
    folder = checkpoints[name]
    loaded = load_config(str(folder))
    fmt = checkpoint_format(loaded.config)
    assert fmt.id == CHECKPOINTS[name][3]
    computed = memory.format_weights(from_config(loaded.config), fmt).total
    assert checkpoint_size_of_folder(folder).bytes == computed
    # The safetensors header agrees with itself: the file less 8 bytes and the header.
    data = (folder / "model.safetensors").read_bytes()
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    assert max(ends) == computed


def test_the_report_shows_the_files_beside_the_computed_weights(checkpoints, capsys):
    exit_code, out, _ = run_cli(capsys, "inspect", str(checkpoints["llama"]), "--format", "json")
    files = json.loads(out)["memory"]["checkpoint_bytes"]
    assert exit_code == 0 and files["source"] == "model.safetensors header"
    exit_code, out, _ = run_cli(capsys, "inspect", str(checkpoints["llama"]))
    assert "of the computed figure" in out


def test_exact_bytes_through_the_hub_index_and_a_range_request(checkpoints, tmp_path, monkeypatch):
    single = (checkpoints["llama"] / "model.safetensors").read_bytes()
    config = (checkpoints["llama"] / "config.json").read_bytes()
    index = json.dumps({"metadata": {"total_size": 123456}, "weight_map": {}}).encode()
    repos = {
        "org/single": {"main": {"config.json": config, "model.safetensors": single}},
        "org/sharded": {"main": {"config.json": config, "model.safetensors.index.json": index}},
    }
    with hub_environment(tmp_path, monkeypatch, repos) as hub:
        for repo_id, expected, source in (
            ("org/single", checkpoint_size_of_folder(checkpoints["llama"]).bytes, "header"),
            ("org/sharded", 123456, "total_size"),
        ):
            loaded = load_config(repo_id)
            size = checkpoint_size(loaded)
            assert size.bytes == expected and source in size.source
        ranges = [r.headers.get("range") for r in hub.requests if "model.safetensors" in r.path]
        assert "bytes=0-7" in ranges  # 8 bytes asked for, not the weights


# -- hostile input ---------------------------------------------------------------------------


def test_a_named_pipe_is_refused_at_once_an_anonymous_one_is_read(tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):  # the pipe, and a folder whose config.json is one
        exit_code, out, err = run_cli(capsys, "inspect", str(path))
        assert exit_code == 14 and out == "" and "named pipe (FIFO)" in err, err
    read, write = os.pipe()
    text = load_config("bundled:openai-community/gpt2").path.read_bytes()
    writer = threading.Thread(target=lambda: (os.write(write, text), os.close(write)))
    writer.start()
    exit_code, out, err = run_cli(capsys, "inspect", f"/dev/fd/{read}", "--format", "json")
    writer.join()
    os.close(read)
    assert exit_code == 0 and json.loads(out)["model_type"] == "gpt2", err


@pytest.mark.parametrize("name", ["HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"])
@pytest.mark.parametrize("value", ["abc", "-5", "0", "2.5", "1e400"])
def test_hub_timeouts_from_the_environment_are_checked(capsys, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    exit_code, out, err = run_cli(
        capsys, "inspect", "org/model", "--endpoint", "http://127.0.0.1:9", "--timeout", "1"
    )
    assert exit_code == 2 and out == "" and err.count("\n") == 1
    assert f"{name}='{value}' is not a timeout" in err


HTML = "<img src=x onerror=alert(1)>"


@settings(max_examples=8, deadline=None)
@given(
    field=st.sampled_from(
        [
            "architectures",
            "torch_dtype",
            "quant_method",
            "bits",
            "ignore",
            "_name_or_path",
            "model_id",
        ]
    ),  # fmt: skip
    payload=st.sampled_from([HTML, "<script>x</script>", "a|b`c`[d](e)", "&lt;"]),
)
def test_no_config_or_hub_string_reaches_markdown_unescaped(tmp_path_factory, field, payload):
    config = dict(load_config(LLAMA_3).config)
    quantization = {"quant_method": "gptq", "bits": 4}
    if field == "architectures":
        config["architectures"] = [payload]
    elif field in ("torch_dtype", "_name_or_path"):
        config[field] = payload
    elif field in ("quant_method", "bits"):
        quantization[field] = payload
    elif field == "ignore":
        quantization = {"quant_method": "compressed-tensors", "ignore": [payload],
                        "config_groups": {payload: {"weights": {"num_bits": payload}}}}  # fmt: skip
    folder = tmp_path_factory.mktemp("hostile")
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    model = str(folder) if field != "model_id" else f"{folder}/./"
    for command in (
        ["inspect", model, "--gpu", "H100"],
        ["compare", model, LLAMA_3, "--gpu", "L4"],
    ):
        stdout = io.StringIO()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stdout", stdout)
            assert cli.main([*command, "--format", "markdown"]) == 0
        text = stdout.getvalue().replace("<sub>", "").replace("</sub>", "")
        # Escaped (`\<`, `` \` ``) the characters render as text; bare they would be HTML.
        assert not re.search(r"(?<!\\)<", text) and not re.search(r"(?<!\\)`c", text), text


def test_gpu_memory_source_names_the_tables_figure(capsys):
    exit_code, out, _ = run_cli(capsys, "inspect", LLAMA_3, "--gpu", "tpu-v5e", "--format", "json")
    fits = json.loads(out)["fits"]
    assert fits["gpu_memory_source"] == "nominal (datasheet)"


# -- prune: the new user's findings ---------------------------------------------------------


def test_prune_target_messages_and_flags():
    from keras_mha.commands import prune
    from keras_mha.errors import PruningError

    with pytest.raises(PruningError) as raised:
        prune._prune_target(5, layers=list(range(6)), uniform=True)
    assert "(e.g. 6)" in str(raised.value)
    with pytest.raises(PruningError, match=r"\(e\.g\. 12 or 18\)"):
        prune._prune_target(13, layers=list(range(6)), uniform=True)
    arguments = cli.build_parser().parse_args(
        ["prune", "src", "--target", "10%", "--out", "o", "--batch", "4", "--offline",
         "--endpoint", "http://127.0.0.1:9", "--timeout", "3", "--revision", "main"]
    )  # fmt: skip
    assert (arguments.batch_size, arguments.offline, arguments.timeout) == (4, True, 3.0)
    note = prune._rounding(arguments, removed=6, total=72)
    assert note.startswith("--target 0.1 asks for 7.2 of 72 heads; 6 (8.3%) removed")
    assert prune._rounding(arguments, removed=6, total=60) is None
    inspect = cli.build_parser().parse_args(["inspect", "x", "--batch-size", "3"])
    assert inspect.batch == 3
