"""Config loading: inheritance, overrides, YAML round trip, and every validation error."""

import re
import warnings
from pathlib import Path

import pytest

from tinyattn.config import (Config, apply_overrides, check_sampling, config_from_dict, config_to_dict,
                             config_text, given_keys, load_config, save_config)
from tinyattn.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_every_shipped_config_loads():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert isinstance(load_config(path), Config), path


def test_extends_deep_merges(tmp_path):
    write(tmp_path / "base.yaml", "model:\n  n_layer: 3\n  n_embd: 64\ntrain:\n  lr: 0.01\ndata:\n  files: a.txt\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\nmodel:\n  n_layer: 5\n")
    config = load_config(child)
    assert config.model.n_layer == 5  # overridden by the child
    assert config.model.n_embd == 64  # inherited from the base, same section
    assert config.train.lr == 0.01  # inherited, other section
    assert config.train.batch_size == 16  # dataclass default


def test_written_keys_are_what_the_files_and_set_give_at_the_default_or_not(tmp_path):
    # What a fine-tune compares with its source (tinyattn.train.finetune.adopt_model).
    from tinyattn.config import ModelConfig, written_keys

    write(tmp_path / "base.yaml", "model:\n  n_layer: 4\ndata:\n  files: a.txt\n  url: https://example.org/a.txt\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\nmodel:\n  context_length: 256\n"
                                          "data:\n  files: b.txt\n")
    overrides = ["model.rope_base=10000", "tokenizer.vocab_size=512"]
    assert ModelConfig().n_layer == 4 and ModelConfig().context_length == 256  # the defaults, written
    written = written_keys(load_config(child, overrides), child, overrides)
    assert written == {"model.n_layer", "model.context_length", "data.files", "model.rope_base",
                       "tokenizer.vocab_size"}  # the parent's url goes with its data.files
    # Without a file, the keys held at other than their default (and the overrides') stand for it.
    built = Config(model=ModelConfig(n_layer=2))
    assert written_keys(built) == {"model.n_layer"}
    assert written_keys(built, None, ["model.rope_base=10000"]) == {"model.n_layer", "model.rope_base"}
    # The file's own keys, however its path is spelled (./child.yaml, dir//child.yaml)
    own = written_keys(load_config(child), child, (), inherited=False)
    assert own == {"model.context_length", "data.files"}
    for spelled in (f"{tmp_path}/./child.yaml", f"{tmp_path}//child.yaml"):
        assert written_keys(load_config(spelled), spelled, (), inherited=False) == own

def test_given_keys_tell_the_files_own_keys_and_without_a_file_only_the_overrides(tmp_path):
    # The second set is what a new run notes as given but unread (`optim.unused_options`): a parent's
    # keys are its family's defaults, and a Config built in Python holds no file to tell them apart.
    from tinyattn.config import ModelConfig, given_keys

    write(tmp_path / "base.yaml",
          "train:\n  lr: 1.0e-3\ndata:\n  files: a.txt\n  url: https://example.org/a.txt\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\ntrain:\n  min_lr: 1.0e-4\n")
    overrides = ["model.n_layer=3", "data.files=b.txt"]
    every, own = given_keys(load_config(child, overrides), child, overrides)
    # A --set data.files drops the download the file's url described, as a child's data.files does
    assert every == {"train.lr", "train.min_lr", "data.files", "model.n_layer"}
    assert own == {"train.min_lr", "data.files", "model.n_layer"}
    built = Config(model=ModelConfig(n_layer=2))
    assert given_keys(built, None, ["train.lr=1e-3"]) == ({"model.n_layer", "train.lr"}, {"train.lr"})


def test_extends_with_own_files_drops_the_inherited_download(tmp_path):
    write(tmp_path / "base.yaml", "data:\n  files: shakespeare.txt\n  url: https://example.org/s.txt\n"
          f"  sha256: {'ab' * 32}\n  size_bytes: 3\n  text_field: body\n")
    mine = load_config(write(tmp_path / "mine.yaml", "extends: base.yaml\ndata:\n  files: [corpus/*.parquet]\n"))
    assert (mine.data.url, mine.data.sha256, mine.data.size_bytes) == (None, None, None)
    assert mine.data.files == ["corpus/*.parquet"] and mine.data.text_field == "body"  # the rest is inherited
    own = load_config(write(tmp_path / "own.yaml", "extends: base.yaml\ndata:\n  files: b.txt\n"
                                                   "  url: https://example.org/b.txt\n"))
    assert (own.data.url, own.data.sha256) == ("https://example.org/b.txt", None)  # the child's own url
    same = load_config(write(tmp_path / "same.yaml", "extends: base.yaml\nmodel:\n  n_layer: 2\n"))
    assert same.data.url == "https://example.org/s.txt"  # not naming data.files: the download is kept
    # --set data.files names other data in the same way: the file the url describes is not it.
    assert load_config(tmp_path / "base.yaml", ["data.files=mine.txt"]).data.url is None
    assert load_config(tmp_path / "base.yaml", ["data.files=mine.txt", "data.url=https://example.org/m.txt"]
                       ).data.url == "https://example.org/m.txt"
    assert load_config(tmp_path / "base.yaml", ["model.n_layer=2"]).data.url == "https://example.org/s.txt"
    saved = load_config(tmp_path / "base.yaml")  # a resumed run's config with --set (apply_overrides)
    assert apply_overrides(saved, ["data.files=mine.txt"]).data.url is None
    assert apply_overrides(saved, ["model.n_layer=2"]).data.url == "https://example.org/s.txt"



def test_a_child_naming_a_dataset_reads_it_and_not_the_parents_files_too(tmp_path):
    write(tmp_path / "base.yaml", "data:\n  files: shakespeare.txt\n  url: https://example.org/s.txt\n")
    hub = load_config(write(tmp_path / "hub.yaml", "extends: base.yaml\ndata:\n  dataset: roneneldan/TinyStories\n"))
    assert (hub.data.dataset, hub.data.files, hub.data.url) == ("roneneldan/TinyStories", None, None)
    assert load_config(tmp_path / "base.yaml", ["data.dataset=roneneldan/TinyStories"]).data.files is None
    back = load_config(write(tmp_path / "back.yaml", "extends: hub.yaml\ndata:\n  files: mine.txt\n"))
    assert (back.data.dataset, back.data.files) == (None, ["mine.txt"])


def test_default_prompt_starts_from_end_of_text_whatever_the_corpus(tmp_path):
    from tinyattn.data.tokenizer import build_tokenizer
    from tinyattn.generate.text import encode_prompt

    child = write(tmp_path / "mine.yaml", f"extends: {ROOT / 'configs' / 'shakespeare_char.yaml'}\n"
                                          "data:\n  files: one_line.txt\n")
    prompt = load_config(child).sample.prompt
    assert prompt == "" == Config().sample.prompt
    no_newlines = build_tokenizer(Config().tokenizer, lambda: iter(["a corpus without a line break"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a newline prompt would warn: the tokenizer never saw one
        assert encode_prompt(no_newlines, prompt, context_length=8) == [no_newlines.eot_id]


def test_extends_chain_and_cycle(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_missing_extends_target_names_the_file_that_extends_it(tmp_path):
    write(tmp_path / "m2.yaml", "extends: missing.yaml\n")
    write(tmp_path / "missing.yaml", "extends: nothere.yaml\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "m2.yaml")
    assert str(caught.value) == (f"{tmp_path / 'missing.yaml'}: extends: nothere.yaml: config file not found "
                                 f"({(tmp_path / 'nothere.yaml').resolve()})")


@pytest.mark.parametrize("parent", ["''", "' '", ".", "configs/"], ids=["empty", "blank", "dot", "folder"])
def test_extends_naming_no_file_is_refused_naming_the_file_that_extends(tmp_path, parent):
    """`extends: ''` (or a folder) read the folder the config is in and said only
    '<folder>: cannot read the config file (Is a directory)', naming neither the file nor its key."""
    (tmp_path / "configs").mkdir()
    write(tmp_path / "child.yaml", f"extends: {parent}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "child.yaml")
    assert str(caught.value).startswith(f"{tmp_path / 'child.yaml'}: extends: "), str(caught.value)
    assert str(caught.value).endswith("is not accepted; expected the path of a YAML config file to inherit")


def test_overrides_are_typed_like_the_field(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, ["model.n_layer=8", "train.lr=3e-4", "model.tie_embeddings=false",
                                "model.n_kv_head=null", "sample.prompt=Hello there"])
    assert config.model.n_layer == 8 and isinstance(config.model.n_layer, int)
    assert config.train.lr == 3e-4 and isinstance(config.train.lr, float)
    assert config.model.tie_embeddings is False
    assert config.model.n_kv_head is None
    assert config.sample.prompt == "Hello there"



@pytest.mark.parametrize("typed, kept", [("1.10", "1.10"), ("0123", "0123"), ("yes", "yes"), ("1_000", "1_000"),
                                         ("Q: what", "Q: what"), ("#1 hit", "#1 hit"), ("'1.10'", "1.10")])
def test_a_set_text_field_keeps_the_text_as_typed(tmp_path, typed, kept):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, [f"sample.prompt={typed}", f"data.revision={typed}"])
    assert (config.sample.prompt, config.data.revision) == (kept, kept)
    assert load_config(path, ["data.revision=null"]).data.revision is None  # null still means null


def test_a_set_text_field_under_by_precision_keeps_the_text_as_typed(tmp_path):
    # A file's by_precision kept `revision: 1.10` as typed; the same key given with --set was 1.1,
    # probe_text=yes was refused ("expected a string, got True") and a prompt lost its ' #2'.
    from tinyattn.config import for_precision

    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, ["by_precision.bf16.data.revision=1.10",
                                "by_precision.bf16.train.probe_text=yes",
                                "by_precision.bf16.sample.prompt=Act 1 #2"])
    bf16 = for_precision(config, "bf16")[0]
    assert (bf16.data.revision, bf16.train.probe_text, bf16.sample.prompt) == ("1.10", "yes", "Act 1 #2")
    nulled = load_config(path, ["by_precision.bf16.data.revision=null"])
    assert nulled.by_precision == {"bf16": {"data": {"revision": None}}}  # null still means null


@pytest.mark.parametrize("typed", ["Act 1 #2", "ROMEO: what #light", "&a x", "*a", "|", ">", "!!str x"])
def test_a_set_text_field_keeps_what_yaml_reads_as_a_comment_anchor_or_block(tmp_path, typed):
    """YAML reads ' #2' as a comment, '&a' as an anchor, '|' and '>' as block scalars: a --set of a
    text field gave 'Act 1', 'x' or '' where the text was typed whole."""
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, [f"sample.prompt={typed}", f"train.probe_text={typed}"])
    assert (config.sample.prompt, config.train.probe_text) == (typed, typed)
    quoted = load_config(path, ["sample.prompt='a #b'", 'train.probe_text="x\\ny"'])
    assert (quoted.sample.prompt, quoted.train.probe_text) == ("a #b", "x\ny")  # quotes still quote


@pytest.mark.parametrize("typed, kept", [("1.10", "1.10"), ("0123", "0123"), ("yes", "yes"),
                                         ("1_000", "1_000"), ("2024-01-05", "2024-01-05"),
                                         ("'1.10'", "1.10")])
def test_a_text_field_in_a_config_file_keeps_the_text_as_typed(tmp_path, typed, kept):
    path = write(tmp_path / "c.yaml", f"data:\n  files: a.txt\n  revision: {typed}\n"
                                      f"sample:\n  prompt: {typed}\n  temperature: 1.10\n")
    config = load_config(path)
    assert (config.sample.prompt, config.data.revision) == (kept, kept)
    assert config.sample.temperature == 1.1  # a number field still reads a number
    for null in ("null", "~", ""):
        assert load_config(write(tmp_path / "n.yaml", f"data:\n  files: a.txt\n  revision: {null}\n")
                           ).data.revision is None  # null still means null


def test_null_for_a_text_field_without_null_is_refused_saying_how_to_write_an_empty_text_or_the_word(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path, ["sample.prompt=null"])
    assert str(refused.value) == ("--set: sample.prompt: expected a string, got null, which this field does not "
                                  "take (an empty text: sample.prompt= ; the word: sample.prompt='null')")
    assert load_config(path, ["sample.prompt=", "train.probe_text='null'"]).sample.prompt == ""
    assert load_config(path, ["train.probe_text='null'"]).train.probe_text == "null"  # as the advice says
    in_file = write(tmp_path / "n.yaml", "data:\n  files: a.txt\nsample:\n  prompt:\n")
    with pytest.raises(ConfigError, match=r'n\.yaml: sample\.prompt: expected a string, got null, which this '
                                          r'field does not take \(an empty text: prompt: ""; the word: prompt: "null"\)$'):
        load_config(in_file)
    with pytest.raises(ConfigError, match=r"train\.max_steps: expected an integer, got null, which this field "
                                          r"does not take$"):
        load_config(path, ["train.max_steps=null"])


def test_a_number_field_reads_its_number_in_decimal_or_refuses_another_base(tmp_path):
    # YAML 1.1 reads 0100 as octal 64, 1:30 as 90 (base 60), 0x10 as 16: a --set and a config file
    # (a run's config.yaml on resume too) read 0100 as 100 and refuse the others in one line
    items = ["train.max_steps=0100", "train.seed=0777", "model.n_layer=010", "train.lr=0100.5",
             "train.dropout_by_passes={010: 0.1}", "sample.prompt=0123"]
    config = load_config(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"), items)
    file = write(tmp_path / "f.yaml", "data:\n  files: a.txt\nmodel:\n  n_layer: 010\n"
                                      "train:\n  max_steps: 0100\n  seed: 0777\n  lr: 0100.5\n"
                                      "  dropout_by_passes: {010: 0.1}\nsample:\n  prompt: 0123\n")
    for read in (config, load_config(file)):
        assert (read.train.max_steps, read.train.seed, read.model.n_layer) == (100, 777, 10)
        assert (read.train.lr, read.train.dropout_by_passes) == (100.5, {10.0: 0.1})
        assert read.sample.prompt == "0123"  # a text field keeps its zero
    for item, expected in [("train.warmup_steps=1:30", "an integer"), ("train.lr=0x10", "a number"),
                           ("train.seed=0b101", "an integer")]:
        key, value = item.split("=")
        said = f"{key}: expected {expected} written in decimal, got {value!r}"
        with pytest.raises(ConfigError, match=f"^--set: {re.escape(said)}$"):
            load_config(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"), [item])
        section, name = key.split(".")
        path = write(tmp_path / "g.yaml", f"data:\n  files: a.txt\n{section}:\n  {name}: {value}\n")
        with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {re.escape(said)}$"):
            load_config(path)
    quoted = write(tmp_path / "q.yaml", "data:\n  files: a.txt\n  revision: '0x10'\n")
    text = load_config(quoted, ["sample.prompt=1:30"])
    assert (text.data.revision, text.sample.prompt) == ("0x10", "1:30")  # text stays as typed


def test_a_negative_number_with_a_leading_zero_reads_in_decimal_too(tmp_path):
    # YAML 1.1 reads -010 as octal -8: the sign does not change the base a person means
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    with pytest.raises(ConfigError, match=r"^--set: train\.seed: -10 is not accepted"):
        load_config(path, ["train.seed=-010"])


def test_a_number_under_by_precision_reads_in_decimal_or_refuses_another_base(tmp_path):
    # by_precision.<precision> holds the same fields one level deeper: 010 is 10 there too, and
    # 0x10 is refused, in a config file and in a --set
    from tinyattn.config import for_precision

    file = write(tmp_path / "p.yaml", "data:\n  files: a.txt\nby_precision:\n  fp32:\n"
                                      "    train: {eval_interval: 010, warmup_steps: 0100}\n")
    given = load_config(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"),
                        ["by_precision.fp32.train.eval_interval=010",
                         "by_precision.fp32.train.warmup_steps=0100"])
    for read in (load_config(file), given):
        train = for_precision(read, "fp32")[0].train
        assert (train.eval_interval, train.warmup_steps) == (10, 100)
    said = "by_precision.fp32: train.lr: expected a number written in decimal, got '0x10'"
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(write(tmp_path / "h.yaml", "data:\n  files: a.txt\nby_precision:\n  fp32:\n"
                                               "    train: {lr: 0x10}\n"))
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"),
                    ["by_precision.fp32.train.lr=0x10"])


def test_the_last_set_of_a_key_is_the_one_that_counts(tmp_path):
    from tinyattn.config import override_value

    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    items = ["train.out_dir=first", "model.n_layer=3", "train.out_dir=second"]
    assert load_config(path, items).train.out_dir == "second"
    assert override_value(items, "train.out_dir", "checkpoints") == "second"  # what --resume looks in
    assert override_value(items, "train.max_steps", None) is None


def test_a_set_value_keeps_every_equals_sign_after_the_first_and_may_be_empty(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\nsample:\n  prompt: Once\n")
    assert load_config(path, ["sample.prompt=a = b=c"]).sample.prompt == "a = b=c"
    assert load_config(path, ["sample.prompt="]).sample.prompt == ""  # empty: start from <|endoftext|>


def test_values_at_the_edges_of_what_is_accepted_load(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, ["train.lr=0.002", "train.min_lr=0.002", "train.decay_fraction=1",
                                "train.seed=9223372036854775807", "sample.max_new_tokens=0",
                                "data.validation_fraction=0.999", "data.max_documents=1",
                                "train.max_steps=1e3"])
    assert (config.train.min_lr, config.train.decay_fraction, config.train.seed) == (0.002, 1.0, 2**63 - 1)
    assert (config.sample.max_new_tokens, config.data.max_documents, config.train.max_steps) == (0, 1, 1000)


def test_a_long_bad_value_is_shown_cut_to_a_readable_length(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    long_words = "[" + ", ".join(f"word{i}" * 20 for i in range(6)) + "]"  # six items of 100 characters
    expected = r"^--set: model\.n_layer: expected an integer, got \['word0"
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path, [f"model.n_layer={long_words}"])
    shown = str(info.value).split("got ", 1)[1]
    assert len(shown) == 120 and shown.endswith("...")


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("10min", 600), ("1.5h", 5400),
                                           ("2h", 7200), ("600", 600), (" 45 s ", 45)])
def test_a_duration_is_read_in_seconds_minutes_or_hours(text, seconds):
    from tinyattn.config import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0", "-5m", "10d", "m", "ten minutes"])
def test_a_duration_that_is_not_positive_or_has_another_unit_is_refused(text):
    from tinyattn.config import parse_duration

    expected = "expected a positive duration such as 90s, 10m (or 10min), 2h or 600 (seconds)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_duration(text)


def test_yaml_round_trip_and_rebuild(tmp_path):
    config = load_config(ROOT / "configs" / "tinystories.yaml",
                         ["model.vocab_size=300", "sample.prompt=Ça, 東京"])
    save_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    saved = (tmp_path / "resolved.yaml").read_text(encoding="utf-8")
    assert "prompt: Ça, 東京" in saved  # readable, not escaped
    assert config_from_dict(config_to_dict(config)) == config


def test_stop_tokens_are_saved_where_given_and_left_out_of_a_plain_runs_config_yaml(tmp_path):
    # Only a fine-tune of a folder with several eos ids has them: every other run's file is as it was.
    plain = load_config(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"))
    assert plain.tokenizer.stop_tokens == [] and "stop_tokens" not in config_text(plain)
    given = load_config(write(tmp_path / "p.yaml", "data:\n  files: a.txt\ntokenizer: {kind: pretrained, "
                                                   "path: t.json, stop_tokens: ['<|endoftext|>']}\n"))
    save_config(given, tmp_path / "resolved.yaml")
    assert "stop_tokens:\n  - <|endoftext|>\n" in (tmp_path / "resolved.yaml").read_text(encoding="utf-8")
    assert load_config(tmp_path / "resolved.yaml") == given


def test_a_dropout_table_reads_as_numbers_and_survives_the_round_trip(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\ntrain:\n  dropout_by_passes: {6: 0.075, 9.5: '1e-1'}\n")
    config = load_config(path)
    assert config.train.dropout_by_passes == {6.0: 0.075, 9.5: 0.1}
    assert load_config(path, ["train.dropout_by_passes={}"]).train.dropout_by_passes == {}
    save_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    child = write(tmp_path / "child.yaml", "extends: c.yaml\ntrain:\n  dropout_by_passes: {3: 0.2}\n")
    assert load_config(child).train.dropout_by_passes == {3.0: 0.2}  # replaced whole, not merged
    cleared = write(tmp_path / "cleared.yaml", "extends: c.yaml\ntrain:\n  dropout_by_passes: {}\n")
    assert load_config(cleared).train.dropout_by_passes == {}


@pytest.mark.parametrize("text, overrides, message", [
    ("model:\n  n_layr: 4\n", [], r"c\.yaml: unknown key 'model\.n_layr'; did you mean 'n_layer'\?"),
    ("modle:\n  n_layer: 4\n", [], r"unknown key 'modle'; did you mean 'model'\?"),
    ("", ["train.learning_rate=1"], r"--set: unknown key 'train\.learning_rate'"),
    ("", ["trian.lr=1"], r"--set: unknown key 'trian'; did you mean 'train'\?"),
    ("train:\n  lr: 0.1\n", ["train.lr.x=3"], r"--set: train\.lr: expected a number, got \{'x': 3\}"),
    # --set adding to a table of the file's: the file's bad entry is still the file's
    ("train:\n  dropout_by_passes: {1: 0.1, 2: bad}\n", ["train.dropout_by_passes.3=0.2"],
     r"c\.yaml: train\.dropout_by_passes: expected a mapping of numbers to numbers"),
    ("model:\n  n_layer: four\n", [], r"c\.yaml: model\.n_layer: expected an integer, got 'four'"),
    ("train:\n  lr: fast\n", [], r"train\.lr: expected a number, got 'fast'"),
    ("model:\n  tie_embeddings: 1\n", [], r"model\.tie_embeddings: expected true or false"),
    ("model:\n  n_embd: 100\n  n_head: 3\n", [], r"model\.n_embd: 100 is not accepted; must be divisible by model\.n_head=3"),
    ("model:\n  n_head: 4\n  n_kv_head: 3\n", [], r"model\.n_head: 4 is not accepted; must be divisible by model\.n_kv_head=3"),
    ("model:\n  n_layer: 0\n", [], r"model\.n_layer: 0 is not accepted; expected a positive integer"),
    ("model:\n  n_embd: -8\n", [], r"model\.n_embd: -8 is not accepted"),
    ("model:\n  n_embd: 12\n  n_head: 4\n", [], r"must be even for rotary"),
    ("train:\n  precision: bf61\n", [], r"train\.precision: 'bf61' is not accepted; expected one of .*did you mean 'bf16'"),
    ("tokenizer:\n  kind: pretrained\n", [], r"tokenizer\.path: None is not accepted"),
    ("sample:\n  top_p: 1.5\n", [], r"sample\.top_p: 1\.5 is not accepted; expected a number in \(0, 1\]"),
    ("model: [1, 2]\n", [], r"c\.yaml: model: expected a mapping"),
    ("model:\n  n_layer: [\n", [], r"c\.yaml: invalid YAML at line"),
    # A tab in the indentation: libyaml's message does not name the character; the line does
    ("model:\n\tn_layer: 2\n", [], r"c\.yaml: invalid YAML at line 4, column 1: .*: a tab; YAML indents "
     r"with spaces, never tabs$"),
    # Where libyaml names the tab itself, its message is enough
    ("model:\n  n_layer: 2\n  \tn_head: 2\n", [],
     r"c\.yaml: invalid YAML at line 5, column 3: found a tab character that violates indentation$"),
    ("", ["model.n_layer"], r"--set: expected key=value"),
    ("", ["lr=1"], r"^--set: expected a dotted key such as train\.lr, got 'lr'$"),
    ("", ["model.n_kv_head="], r"^--set: model\.n_kv_head: expected an integer or null, got ''$"),  # not null
    # --set made two sections: the error in the first is still named --set
    ("", ["trian.lr.x=3"], r"^--set: unknown key 'trian'; did you mean 'train'"),
    # YAML reads 2.5e0 as a string: as a number, it is still not an integer
    ("", ["model.n_layer=2.5e0"], r"^--set: model\.n_layer: expected an integer, got '2\.5e0'$"),
    # Non-finite numbers are refused up front, naming their own key (not a later one).
    ("", ["train.lr=.nan"], r"--set: train\.lr: nan is not accepted; expected a finite number"),
    ("", ["model.rope_base=.nan"], r"--set: model\.rope_base: nan is not accepted; expected a finite number"),
    ("", ["train.min_lr=inf"], r"--set: train\.min_lr: 'inf' is not accepted; expected a finite number"),
    ("train:\n  weight_decay: -.inf\n", [], r"c\.yaml: train\.weight_decay: -inf is not accepted; expected a finite"),
    ("", ["train.dropout_by_passes={6: 1.5}"], r"--set: train\.dropout_by_passes\.6: 1\.5 is not accepted; expected a dropout in \[0, 1\)"),
    ("", ["train.dropout_by_passes={-1: 0.1}"], r"train\.dropout_by_passes: -1\.0 is not accepted; expected passes >= 0"),
    ("train:\n  dropout_by_passes: 0.1\n", [], r"c\.yaml: train\.dropout_by_passes: expected a mapping of numbers to numbers, got 0\.1"),
    ("train:\n  dropout_by_passes: {six: 0.1}\n", [], r"train\.dropout_by_passes: expected a mapping of numbers to numbers, got"),
    # Without the space YAML reads 6:0.1 as one key (a number in base 60) with no value.
    ("", ["train.dropout_by_passes={6:0.1}"],
     r"--set: train\.dropout_by_passes: a key without a value; write a space after each colon"),
    ("train:\n  decay_by_passes: {3.5:0.2, 6: 0.5}\n", [],
     r"c\.yaml: train\.decay_by_passes: a key without a value; write a space"),
    ("", ["train.floor_by_passes={10: 1.5}"], r"--set: train\.floor_by_passes\.10: 1\.5 is not accepted; expected a share of train\.lr in \[0, 1\]"),
    ("", ["train.floor_by_passes={-2: 0.3}"], r"train\.floor_by_passes: -2\.0 is not accepted; expected passes >= 0 as keys, e\.g\. \{10: 0\.3\}"),
    ("", ["train.decay_by_passes={4: -0.1}"], r"--set: train\.decay_by_passes\.4: -0\.1 is not accepted; expected a weight decay >= 0"),
    ("", ["tokenizer.end_of_text=</s>"], r"tokenizer\.end_of_text: '</s>' is not accepted; a token of a pretrained tokenizer"),
    ("", ["tokenizer.stop_tokens=<|im_end|>"],
     r"^--set: tokenizer\.stop_tokens: \['<\|im_end\|>'\] is not accepted; tokens of a pretrained tokenizer "
     r"\(tokenizer\.kind=pretrained\); char and bpe tokenizers stop at <\|endoftext\|> alone$"),
    ("tokenizer: {kind: pretrained, path: t.json}\n", ["tokenizer.stop_tokens=['']"],
     r"^--set: tokenizer\.stop_tokens: \[''\] is not accepted; expected tokens of the tokenizer as its "
     r"vocabulary spells them, e\.g\. \['<\|im_end\|>'\], or \[\]$"),
    ("tokenizer: {kind: pretrained, path: t.json}\n", ["tokenizer.stop_tokens=[151643]"],
     r"^--set: tokenizer\.stop_tokens: expected a list of strings, got \[151643\]$"),
    # An integer field takes only whole numbers: 2.5 layers is not rounded, true is not 1.
    ("", ["model.n_layer=2.5"], r"--set: model\.n_layer: expected an integer, got 2\.5"),
    ("", ["model.n_layer=true"], r"--set: model\.n_layer: expected an integer, got True"),
    ("model:\n  dropout: 1.0\n", [], r"c\.yaml: model\.dropout: 1\.0 is not accepted; expected a number in \[0, 1\)"),
    # A file's source and a --set of the other: both named, neither dropped (see _drop_inherited_source)
    ("", ["data.dataset=roneneldan/TinyStories", "data.files=b.txt"],
     r"data\.files: \['b\.txt'\] is not accepted; set exactly one of data\.dataset \(a hub name\) or data\.files"),
    # An unknown hook is refused with the closest name, not left for the first evaluation to meet
    ("", ["train.show=[sample, samples]"],
     r"^--set: train\.show: 'samples' is not accepted; expected a list of sample, loss_by_position, "
     r"attention, head_ablation \(did you mean 'sample'\?\)$"),
    ("train:\n  show: [attention]\n", [],
     r"c\.yaml: train\.probe_text: '' is not accepted; expected a text for train\.show's attention"),
    ("model:\n  attention_dropout: 1.0\n", [],
     r"c\.yaml: model\.attention_dropout: 1\.0 is not accepted; expected a number in \[0, 1\)"),
    ("", ["train.min_lr=0.01", "train.lr=0.001"],
     r"--set: train\.min_lr: 0\.01 is not accepted; expected a number in \[0, train\.lr=0\.001\]"),
    ("", ["train.grad_clip=-1"],
     r"--set: train\.grad_clip: -1\.0 is not accepted; expected a non-negative number"),
    ("", ["train.warmup_steps=-1"],
     r"--set: train\.warmup_steps: -1 is not accepted; expected a non-negative integer"),
    ("", ["train.ema=1.0"], r"--set: train\.ema: 1\.0 is not accepted; expected a number in \(0, 1\)"),
    ("", ["train.ema=0"], r"--set: train\.ema: 0\.0 is not accepted; expected a number in \(0, 1\)"),
    ("", ["train.keep_last=0"], r"--set: train\.keep_last: 0 is not accepted; expected an integer >= 1"),
    ("", ["train.seed=100000000000000000000000"],
     r"--set: train\.seed: 100000000000000000000000 is not accepted; expected an integer in \[0, 2\*\*63\)"),
    ("", ["train.seed=-1"], r"--set: train\.seed: -1 is not accepted"),
    ("", ["tokenizer.path=tok.json"],
     r"--set: tokenizer\.path: 'tok\.json' is not accepted; it is read only with tokenizer\.kind=pretrained"),
    ("", ["train.peak_flops=-1e12"],
     r"--set: train\.peak_flops: -1000000000000\.0 is not accepted; expected a positive"),
    ("", ["train.time_budget=0s"],
     r"--set: train\.time_budget: '0s' is not accepted; expected a positive duration"),
    ("", ["data.validation_fraction=1.0"],
     r"--set: data\.validation_fraction: 1\.0 is not accepted; expected a number in \(0, 1\)"),
    ("", ["data.validation_fraction=0"],
     r"--set: data\.validation_fraction: 0\.0 is not accepted; expected a number in \(0, 1\)"),
    ("", ["data.max_documents=0"],
     r"--set: data\.max_documents: 0 is not accepted; expected a positive integer or null"),
    ("", ["data.files=[a.txt, b.txt]", "data.url=https://example.com/a.txt"],
     r"--set: data\.url: 'https://example\.com/a\.txt' is not accepted; needs data\.files to be the single"),
    ("", ["train.seed=9223372036854775808"],
     r"--set: train\.seed: 9223372036854775808 is not accepted; expected an integer in \[0, 2\*\*63\)"),
    ("", ["train.eval_windows=0"],
     r"--set: train\.eval_windows: 0 is not accepted; expected a positive integer or null \(all windows\)"),
    ("tokenizer:\n  kind: bpe\n  vocab_size: 0\n", [],
     r"c\.yaml: tokenizer\.vocab_size: 0 is not accepted; expected a positive integer"),
    # Past 2**63 no integer setting means anything: torch cannot hold it (an OverflowError mid-run)
    ("", ["train.grad_accum_steps=1e30"],
     r"^--set: train\.grad_accum_steps: 1000000000000000019884624838656 is not accepted; expected an "
     r"integer below 2\*\*63$"),
    ("train:\n  log_interval: 99999999999999999999\n", [],
     r"^\S*c\.yaml: train\.log_interval: 99999999999999999999 is not accepted; expected an integer "
     r"below 2\*\*63$"),
    # A choice's hint reads the value whatever its case: BF16 is bf16, not fp16
    ("", ["train.precision=BF16"],
     r"'BF16' is not accepted; expected one of auto, fp32, bf16, fp16 \(did you mean 'bf16'\?\)$"),
    ("", ["tokenizer.kind=BPE"],
     r"'BPE' is not accepted; expected one of char, bpe, pretrained \(did you mean 'bpe'\?\)$"),
    # A download's checks that no file can pass: refused before the download, not after it
    ("", ["data.sha256=86c4e6aa9db7"],
     r"^--set: data\.sha256: '86c4e6aa9db7' is not accepted; expected 64 hexadecimal digits \(sha256sum's\)"),
    ("", ["data.size_bytes=-1"], r"^--set: data\.size_bytes: -1 is not accepted; expected a positive integer or null"),
    ("", ["data.size_bytes=0"], r"^--set: data\.size_bytes: 0 is not accepted; expected a positive integer or null"),
    # A dotted key with an empty part is --set's mistake, named as such
    ("", [".lr=1"], r"^--set: expected a dotted key such as train\.lr, got '\.lr'$"),
    ("", ["train.=1"], r"^--set: expected a dotted key such as train\.lr, got 'train\.'$"),
])
def test_validation_errors_name_file_key_and_what_is_accepted(tmp_path, text, overrides, message):
    _refused_in_one_line(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n" + text), overrides, message)


def _refused_in_one_line(path, overrides, message):
    """Reading the config at `path` with `overrides` is a one-line ConfigError matching `message`."""
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path, overrides)
    assert "\n" not in str(info.value)  # one line


@pytest.mark.parametrize("text, overrides, message", [
    ("", ["data.files="], r"^--set: data\.files: '' is not accepted; expected a path, glob or folder$"),
    ("", ["data.files=['']"], r"^--set: data\.files: '' is not accepted; expected a path, glob or folder$"),
    ("", ["data.files='  '"], r"^--set: data\.files: '  ' is not accepted; expected a path, glob or folder$"),
    ("", ["data.files=[a.txt, '']"], r"^--set: data\.files: '' is not accepted; expected a path, glob or folder$"),
    ("data:\n  files: ['']\n", [], r"^.*c\.yaml: data\.files: '' is not accepted; expected a path, glob"),
    ("", ["data.files=null", "data.dataset="],
     r"^--set: data\.dataset: '' is not accepted; expected a hub name or a dataset folder$"),
    ("", ["data.cache_dir="], r"^--set: data\.cache_dir: '' is not accepted; expected a folder"),
    ("", ["data.cache_dir=' '"], r"^--set: data\.cache_dir: ' ' is not accepted; expected a folder"),
    ("", ["train.out_dir="], r"^--set: train\.out_dir: '' is not accepted; expected a folder"),
])
def test_an_empty_or_blank_path_is_refused_not_read_as_the_current_folder(tmp_path, text, overrides, message):
    """Path("") is the current folder: an empty data.files read everything below it (checkpoints
    included), an empty data.dataset read it as a dataset folder, an empty data.cache_dir or
    train.out_dir wrote into it. Each is refused when the config is read, before any work."""
    _refused_in_one_line(write(tmp_path / "c.yaml", ("data:\n  files: a.txt\n" if not text else "") + text),
                         overrides, message)


def test_an_empty_init_from_still_means_none(tmp_path):
    """train.init_from's empty text is read as "no source" (`init_source`), not as a folder: kept."""
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    assert load_config(path, ["train.init_from="]).train.init_from == ""


def test_error_names_the_file_the_key_came_from(tmp_path):
    write(tmp_path / "base.yaml", "data:\n  files: a.txt\nmodel:\n  n_head: 5\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\n")
    with pytest.raises(ConfigError, match=r"base\.yaml: model\.n_embd.*n_head=5"):
        load_config(child)


@pytest.mark.parametrize("encoding, mark, byte", [("utf-16-le", "UTF-16", 0), ("utf-16-be", "UTF-16", 0),
                                                   ("utf-32-le", "UTF-32", 0), ("utf-32-be", "UTF-32", 2)])
def test_a_text_file_saved_as_utf16_or_utf32_is_named_so(tmp_path, encoding, mark, byte):
    # A prompt file saved by Notepad as "Unicode" or by PowerShell's `>`: the line said only "not UTF-8
    # text (byte 0)", where data.files' reading names the byte-order mark and what to do.
    from tinyattn.errors import DataError
    from tinyattn.system.storage import read_text

    path = tmp_path / "prompt.txt"
    path.write_bytes(("\ufeff" + "ROMEO:").encode(encoding))
    expected = (rf"^\S*prompt\.txt: the prompt file is not UTF-8 text \(byte {byte}\): "
                rf"it starts with {mark}'s byte-order mark; save it as UTF-8$")
    with pytest.raises(DataError, match=expected):
        read_text(path, "prompt file")
    path.write_bytes(b"caf\xe9")  # another encoding with no mark: as before
    with pytest.raises(DataError, match=r"prompt\.txt: the prompt file is not UTF-8 text \(byte 3\)$"):
        read_text(path, "prompt file")


def test_missing_file_and_missing_source(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"set exactly one of data\.dataset .* or data\.files"):
        load_config(write(tmp_path / "c.yaml", "model:\n  n_layer: 2\n"))


def test_a_config_file_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"train:\n  lr: 1e-3  # caf\xe9\n")  # \xe9 is byte 24: not UTF-8
    not_utf8 = r"^\S*latin1\.yaml: the config file is not UTF-8 text \(byte 24\)$"
    with pytest.raises(ConfigError, match=not_utf8):
        load_config(latin1)
    with pytest.raises(ConfigError, match=r"^\S*: cannot read the config file \(Is a directory\)$"):
        load_config(tmp_path)


@pytest.mark.parametrize("text, key, line", [
    ("train:\n  max_steps: 4\nmodel:\n  n_layer: 2\ntrain:\n  lr: 0.1\n", "'train'", 5),  # a section twice
    ("model:\n  n_layer: 2\n  n_embd: 64\n  n_layer: 3\n", "'n_layer'", 4),  # a key twice in a section
])
def test_a_key_given_twice_in_yaml_is_refused_naming_the_key_and_line(tmp_path, text, key, line):
    path = write(tmp_path / "twice.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert str(path) in message and f"duplicate key {key}" in message and f"at line {line}," in message
    assert "\n" not in message


@pytest.mark.parametrize("text, key", [
    ("train: {lr: 0.1, lr: 0.2}\n", "'lr'"),  # a flow mapping: both on one line
    ("model: {n_layer: 2}\nsample: {top_p: 0.9, temperature: 0.5, top_p: 0.8}\n", "'top_p'"),
])
def test_a_key_given_twice_on_one_line_is_refused_too(tmp_path, text, key):
    path = write(tmp_path / "twice.yaml", "data:\n  files: a.txt\n" + text)
    message = rf"twice\.yaml: invalid YAML at line \d+, column \d+: duplicate key {key}"
    with pytest.raises(ConfigError, match=message):
        load_config(path)


@pytest.mark.parametrize("top", ["1: 2", "true: 2", "null: 2", "1.5: x"])
def test_a_top_level_key_that_is_not_text_is_refused_in_one_line(tmp_path, top):
    # YAML reads these keys as a number, a boolean or null: each is an unknown section, not a traceback
    path = write(tmp_path / "c.yaml", f"data:\n  files: a.txt\n{top}\n")
    _refused_in_one_line(path, [], r"c\.yaml: unknown key '.+' \(valid: model, data, tokenizer, train, sampl")


@pytest.mark.parametrize("section", ["train:\n", "train:\n  # lr: 0.5\n", "train: {}\n", "train: ~\n"])
def test_an_empty_section_in_a_child_config_inherits_the_parents_whole(tmp_path, section):
    write(tmp_path / "base.yaml", "data:\n  files: a.txt\ntrain:\n  lr: 0.01\n  time_budget: 10m\n")
    child = load_config(write(tmp_path / "child.yaml", "extends: base.yaml\n" + section))
    assert (child.train.lr, child.train.time_budget) == (0.01, "10m")  # not the defaults: nothing was given
    write(tmp_path / "with_bp.yaml", "extends: base.yaml\nby_precision:\n  fp32:\n    train:\n      lr: 0.02\n")
    assert load_config(tmp_path / "with_bp.yaml").by_precision  # the parent below has one to clear
    cleared = load_config(write(tmp_path / "bp.yaml", "extends: with_bp.yaml\nby_precision: null\n"))
    assert cleared.by_precision == {}  # by_precision: null still clears the parent's (the README's way)


def test_yaml_merge_keys_are_not_taken_for_duplicates(tmp_path):
    path = write(tmp_path / "merge.yaml", "model: &m\n  n_layer: 3\ntrain:\n  lr: 0.01\n"
                                          "sample:\n  <<: {temperature: 0.5}\n  top_p: 0.9\n"
                                          "data:\n  files: a.txt\n")
    assert load_config(path).sample.temperature == 0.5


BY_PRECISION = ("extends: {main}\nby_precision:\n  bf16:\n    model: {{dropout: 0.1, attention_dropout: 0.0}}\n"
                "  fp32:\n    train: {{batch_size: 16}}\n")


def test_for_precision_applies_that_precisions_entry_keeps_set_keys_and_empties_by_precision(tmp_path):
    from tinyattn.config import for_precision

    path = tmp_path / "c.yaml"
    path.write_text(BY_PRECISION.format(main=ROOT / "configs" / "shakespeare_char.yaml"))
    config = load_config(path)
    bf16, changed = for_precision(config, "bf16")
    assert (bf16.model.dropout, bf16.model.attention_dropout, bf16.train.batch_size) == (0.1, 0.0, 32)
    assert changed == ["model.dropout=0.1", "model.attention_dropout=0.0"] and bf16.by_precision == {}
    kept, changed = for_precision(config, "bf16", keep=["model.dropout"])  # what --set gave wins
    assert (kept.model.dropout, changed) == (0.0, ["model.attention_dropout=0.0"])
    fp32, _ = for_precision(config, "fp32")
    assert (fp32.model.dropout, fp32.train.batch_size) == (0.0, 16)
    assert for_precision(config, "fp16")[1] == []  # no entry: nothing changes


@pytest.mark.parametrize("entry,message", [
    ("bf17: {model: {dropout: 0.1}}", "by_precision.bf17: 'bf17' is not a precision; expected one of"),
    # auto is what a run resolves, never what it resolves to: such an entry would never apply.
    ("auto: {model: {dropout: 0.1}}", "by_precision.auto: 'auto' is not a precision; expected one of"),
    ("bf16: {model: {dropout: 2}}", "by_precision.bf16: model.dropout: 2.0 is not accepted"),
    ("bf16: {model: {dropot: 0.1}}", "by_precision.bf16: unknown key 'model.dropot'"),
    ("bf16: 3", "by_precision.bf16: expected sections of keys"),
    # a section with nothing under it: for_precision, applying it, met None where a mapping goes
    ("bf16: {model: null}", "by_precision.bf16: expected sections of keys"),
])
def test_a_bad_by_precision_entry_is_refused_naming_it(tmp_path, entry, message):
    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {ROOT / 'configs' / 'shakespeare_char.yaml'}\nby_precision: {{{entry}}}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_a_path_written_with_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch):
    # A YAML file and a --set value (after "=") reach tinyattn unexpanded: "file not found: ~/corpus.txt".
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "x.yaml").write_text("extends: " + str(ROOT / "configs" / "tiny.yaml") + "\n"
                                     "train: {out_dir: ~/runs}\n", encoding="utf-8")
    config = load_config(tmp_path / "x.yaml", ["data.files=[~/corpus.txt, plain.txt]",
                                               "data.cache_dir=~/cache",
                                               "tokenizer.kind=pretrained", "tokenizer.path=~/tok.json",
                                               "train.init_from=~/base"])
    assert config.data.files == [str(tmp_path / "corpus.txt"), "plain.txt"]
    assert config.data.cache_dir == str(tmp_path / "cache")
    assert config.tokenizer.path == str(tmp_path / "tok.json")
    assert (config.train.init_from, config.train.out_dir) == (str(tmp_path / "base"), str(tmp_path / "runs"))
    folder = load_config(ROOT / "configs" / "tiny.yaml", ["data.files=null", "data.dataset=~/corpus"])
    assert folder.data.dataset == str(tmp_path / "corpus")


def test_an_extends_written_with_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch):
    # the same file's data.files: ~/x.txt was under it, its extends: ~/base.yaml was looked for in
    # <the file's folder>/~/base.yaml: "config file not found"
    home, configs = tmp_path / "home", tmp_path / "configs"
    home.mkdir()
    configs.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write(home / "base.yaml", "model:\n  n_layer: 3\ndata:\n  files: a.txt\n")
    child = write(configs / "child.yaml", "extends: ~/base.yaml\ntrain:\n  out_dir: ~/runs\n")
    config = load_config(child)
    assert config.model.n_layer == 3 and config.train.out_dir == str(home / "runs")


def test_a_rule_between_two_keys_says_where_the_other_key_was_set():
    # --set model.n_kv_head=3 against tiny.yaml's n_head 4 blamed the file alone: "configs/tiny.yaml:
    # model.n_head: 4 is not accepted; must be divisible by model.n_kv_head=3", the --set unnamed.
    tiny = ROOT / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError) as refused:
        load_config(tiny, ["model.n_kv_head=3"])
    assert str(refused.value) == (f"{tiny}: model.n_head: 4 is not accepted; must be divisible by "
                                  "model.n_kv_head=3 (from --set)")
    with pytest.raises(ConfigError) as both_set:  # both from --set: nothing to add
        load_config(tiny, ["model.n_head=4", "model.n_kv_head=3"])
    assert str(both_set.value).endswith("must be divisible by model.n_kv_head=3")
    with pytest.raises(ConfigError) as suggested:  # a setting the rule suggests, not the one in force
        load_config(tiny, ["tokenizer.path=x.json"])
    assert "(from" not in str(suggested.value)


def test_a_rule_names_no_origin_beside_a_key_at_its_default(tmp_path):
    # A key no file and no --set wrote is at its default: "(from base.yaml)" beside model.n_head=4
    # said base.yaml set it, when base.yaml only began the model section.
    write(tmp_path / "base.yaml", "model: {n_layer: 2}\ntrain: {max_steps: 5}\ndata: {files: a.txt}\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\nmodel: {n_embd: 30}\n")
    cases = [(child, [], f"{child}: model.n_embd: 30 is not accepted; must be divisible by model.n_head=4"),
             (tmp_path / "base.yaml", ["model.n_embd=30"],
              "--set: model.n_embd: 30 is not accepted; must be divisible by model.n_head=4"),
             (tmp_path / "base.yaml", ["train.min_lr=0.01"],
              "--set: train.min_lr: 0.01 is not accepted; expected a number in [0, train.lr=0.001] "
              "(lower both)")]
    for path, sets, said in cases:
        with pytest.raises(ConfigError) as refused:
            load_config(path, sets)
        assert str(refused.value) == said
    with pytest.raises(ConfigError) as written:  # written in base.yaml: named
        load_config(write(tmp_path / "lr.yaml", "extends: base.yaml\ntrain: {lr: 0.002}\n"),
                    ["train.min_lr=1"])
    assert str(written.value).endswith(f"[0, train.lr=0.002 (from {tmp_path / 'lr.yaml'})] (lower both)")


def test_an_empty_end_of_text_is_refused_without_blaming_the_tokenizers_kind(tmp_path):
    # tokenizer.kind=pretrained is what the rule asks for and what the file gives: "(from tok.yaml)"
    # beside it pointed at the one key that was right.
    tok = write(tmp_path / "tok.yaml", "tokenizer: {kind: pretrained, path: t.json}\ndata: {files: a.txt}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(tok, ["tokenizer.end_of_text=''"])
    assert str(refused.value) == ("--set: tokenizer.end_of_text: '' is not accepted; expected a token of the "
                                  "tokenizer, e.g. '</s>', or null (its <|endoftext|>)")


# Each rule's bound, one value past it, and the value at it: a mutation sweep found that moving
# any of these bounds by one (or dropping the rule) left every other test passing.
@pytest.mark.parametrize("items, key", [
    (["model.context_length=0"], "model.context_length"),
    (["model.vocab_size=0"], "model.vocab_size"),
    (["model.n_kv_head=0"], "model.n_kv_head"),
    (["model.mlp_hidden=0"], "model.mlp_hidden"),
    (["model.rope_base=0"], "model.rope_base"),
    (["model.logit_softcap=0"], "model.logit_softcap"),
    (["model.norm_eps=0"], "model.norm_eps"),
    (["model.attention_gate=true", "model.attention_gate_rank=0"], "model.attention_gate_rank"),
    (["model.attention_gate=true", "model.attention_gate_rank=128"], "model.attention_gate_rank"),  # C 256
    (["model.attention_gate_rank=4"], "model.attention_gate_rank"),  # no gate to give a rank
    (["data.files=[]"], "data.files"),
    (["data.url=https://example.com/a.txt", "data.files=a[12].txt"], "data.files"),
    (["tokenizer.kind=pretrained", "tokenizer.path="], "tokenizer.path"),
    (["train.log_interval=0"], "train.log_interval"),
    (["train.batch_size=0"], "train.batch_size"),
    (["train.grad_accum_steps=0"], "train.grad_accum_steps"),
    (["train.sample_tokens=-1"], "train.sample_tokens"),
    (["train.lr=0"], "train.lr"),
    (["train.head_lr=0"], "train.head_lr"),
    (["train.muon_lr=0"], "train.muon_lr"),
    (["train.embedding_lr=0"], "train.embedding_lr"),
    (["train.min_lr=-1e-6"], "train.min_lr"),
    (["train.weight_decay=-0.01"], "train.weight_decay"),
    (["train.decay_fraction=0"], "train.decay_fraction"),
    (["train.muon_ns_steps=0"], "train.muon_ns_steps"),
    (["train.muon_momentum=1"], "train.muon_momentum"),
    (["train.beta1=1"], "train.beta1"),
    (["train.beta2=1"], "train.beta2"),
    (["train.peak_flops=0"], "train.peak_flops"),
    (["train.dropout_by_passes={2: 1.0}"], "train.dropout_by_passes.2"),
    (["train.device=gpu"], "train.device"),
    (["train.device=cpu0"], "train.device"),  # torch.device would raise its own traceback on these
    (["train.device=cuda:"], "train.device"),
    (["train.max_steps=9223372036854775808"], "train.max_steps"),  # 2**63: torch holds none
])
def test_a_value_just_past_a_rules_bound_is_refused_naming_its_key(tmp_path, items, key):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    _refused_in_one_line(path, items, rf"^--set: {re.escape(key)}: .* is not accepted; ")


def test_values_at_the_bounds_of_more_rules_load(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    upper = "86C4E6AA9DB7" + "0" * 52  # a digest copied in upper case: the download compares it lower-cased
    config = load_config(path, ["train.warmup_steps=0", "train.sample_tokens=0", f"data.sha256={upper}",
                                "train.dropout_by_passes={0: 0.1}", "train.floor_by_passes={1: 1.0, 5: 0}",
                                "train.decay_by_passes={1: 0}", "train.muon_momentum=0",
                                "model.attention_gate=true", "model.attention_gate_rank=127"])
    assert (config.train.warmup_steps, config.train.sample_tokens, config.data.sha256) == (0, 0, upper)
    assert config.train.dropout_by_passes == {0.0: 0.1}
    assert config.train.floor_by_passes == {1.0: 1.0, 5.0: 0.0}
    assert config.train.muon_momentum == 0.0
    assert config.train.decay_by_passes == {1.0: 0.0}
    assert config.model.attention_gate_rank == 127  # 2 x 127 weights a row: fewer than the gate's own 256
    lowest = load_config(path, ["model.attention_gate=true", "model.attention_gate_rank=1"])
    assert lowest.model.attention_gate_rank == 1


def test_a_boolean_for_a_number_is_refused(tmp_path):
    _refused_in_one_line(write(tmp_path / "c.yaml", "data:\n  files: a.txt\n"), ["train.lr=true"],
                         r"^--set: train\.lr: expected a number, got True$")


def test_a_boolean_for_a_text_field_of_a_saved_config_is_refused_not_made_text():
    with pytest.raises(ConfigError, match=r"sample\.prompt: expected a string, got True$"):
        config_from_dict({"data": {"files": ["a.txt"]}, "sample": {"prompt": True}})


def test_a_number_in_a_text_field_of_a_saved_config_is_read_as_its_text():
    # A config read as plain YAML (train.time_budget: 600 is a number there), as a checkpoint may hold
    # it, loads: the number becomes its text, losslessly, instead of refusing the run's config.
    config = config_from_dict({"data": {"files": ["a.txt"]}, "train": {"time_budget": 600},
                               "sample": {"prompt": 2024}})
    assert (config.train.time_budget, config.sample.prompt) == ("600", "2024")


def test_a_table_given_as_null_is_empty(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\ntrain:\n  floor_by_passes:\n")
    config = load_config(path, ["train.dropout_by_passes=null"])
    assert config.train.floor_by_passes == {} and config.train.dropout_by_passes == {}


def test_the_sampling_rules_refuse_a_boolean_top_k_and_a_seed_torch_cannot_take():
    refused = []
    fail = lambda name, value, accepted: refused.append((name, value))  # noqa: E731
    check_sampling(fail, top_k=True, seed=2**63)
    check_sampling(fail, top_k=0, seed=2**63 - 1)
    assert refused == [("top_k", True), ("seed", 2**63)]


def test_given_keys_read_a_set_key_written_with_spaces_around_it(tmp_path):
    path = write(tmp_path / "c.yaml", "data:\n  files: a.txt\n")
    config = load_config(path, [" train.lr = 0.5"])
    every, own = given_keys(config, None, [" train.lr = 0.5"])
    assert config.train.lr == 0.5 and "train.lr" in every and own == {"train.lr"}


@pytest.mark.parametrize("text", ["", "# nothing yet\n"], ids=["empty", "comments"])
def test_an_empty_config_file_is_every_default(tmp_path, text):
    write(tmp_path / "base.yaml", text)
    config = load_config(write(tmp_path / "c.yaml", "extends: base.yaml\n"), ["data.files=a.txt"])
    assert config.model == Config().model and config.data.files == ["a.txt"]


def test_an_unknown_key_named_like_a_section_is_refused_though_empty(tmp_path):
    write(tmp_path / "base.yaml", "data:\n  files: a.txt\ntrain:\n  lr: 0.01\n")
    _refused_in_one_line(write(tmp_path / "c.yaml", "extends: base.yaml\ntrain:\n  model:\n"), [],
                         r"c\.yaml: unknown key 'train\.model'")
