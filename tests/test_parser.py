from __future__ import annotations

import string
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext.policy.errors import CapabilityParseError
from sandbox_kernel_ext.policy.models import (
    CapabilityDeclaration,
    FilesystemMode,
    SandboxTier,
)
from sandbox_kernel_ext.policy.parser import CapabilityParser

FULL_POLICY = textwrap.dedent(
    """\
    sandbox_tier: firecracker
    network_egress_rules:
      - domain: api.openai.com
        ports: [443]
        rate_limit_per_min: 30
      - domain: "*.anthropic.com"
    filesystem_config:
      mode: read_write
      writable_paths: [/tmp/work]
      readable_paths: [/data]
    resource_limits:
      max_memory_mb: 256
      max_cpu_seconds: 10.5
      max_cost_usd: 0.05
      max_tokens: 50000
    permissions: [read_env]
    env_allowlist: [PATH, HOME]
    paths:
      data:
        root: ./data
        mode: ro
        suffixes: [.CSV, .json]
        max_file_bytes: 1000
        read_approval: true
      out:
        root: /tmp/out
        mode: rw
        write_approval: false
    file_limits:
      max_read_bytes: 1024
      max_write_bytes: 2048
      max_list_entries: 10
      operation_timeout: 1.5
      max_total_bytes: null
      max_file_bytes: 4096
      max_line_chars: 80
      deny_symlinks: true
      backend: store
    """
)


def parse_error(text: str) -> CapabilityParseError:
    with pytest.raises(CapabilityParseError) as info:
        CapabilityParser.from_string(text)
    return info.value


def test_seed_example_parses_unchanged() -> None:
    policy = CapabilityParser.from_string(
        "sandbox_tier: gvisor\nresource_limits:\n  max_memory_mb: 128\n"
    )
    assert policy.sandbox_tier is SandboxTier.gvisor
    assert policy.resource_limits.max_memory_mb == 128
    assert policy.resource_limits.max_cpu_seconds == 30.0
    assert policy.network_egress_rules == []


@pytest.mark.parametrize("text", ["", "   \n", "null", "~", "# only a comment\n"])
def test_empty_or_null_gives_defaults(text: str) -> None:
    assert CapabilityParser.from_string(text) == CapabilityDeclaration()


def test_full_policy_uses_every_field() -> None:
    policy = CapabilityParser.from_string(FULL_POLICY)
    assert policy.sandbox_tier is SandboxTier.firecracker
    openai, anthropic = policy.network_egress_rules
    assert (openai.domain, openai.ports, openai.rate_limit_per_min) == ("api.openai.com", [443], 30)
    assert (anthropic.domain, anthropic.ports, anthropic.rate_limit_per_min) == (
        "*.anthropic.com",
        [],
        60,
    )
    assert policy.filesystem_config.mode is FilesystemMode.read_write
    assert policy.filesystem_config.writable_paths == ["/tmp/work"]
    assert policy.filesystem_config.readable_paths == ["/data"]
    assert policy.resource_limits.model_dump() == {
        "max_memory_mb": 256,
        "max_cpu_seconds": 10.5,
        "max_cost_usd": 0.05,
        "max_tokens": 50000,
        "max_processes": 256,
        "max_file_size_mb": 1024,
        "max_open_files": 256,
        "max_output_mb": 8.0,
    }
    assert policy.permissions == ["read_env"]
    assert policy.env_allowlist == ["PATH", "HOME"]
    assert policy.paths is not None
    data, out = policy.paths["data"], policy.paths["out"]
    assert (data.root, data.mode, data.suffixes, data.max_file_bytes) == (
        "./data",
        "ro",
        [".csv", ".json"],
        1000,
    )
    assert (data.read_approval, data.write_approval) == (True, True)
    assert (out.mode, out.read_approval, out.write_approval) == ("rw", False, False)
    limits = policy.file_limits
    assert limits.max_total_bytes is None
    assert (limits.max_read_bytes, limits.max_line_chars, limits.backend) == (1024, 80, "store")
    assert limits.deny_symlinks is True
    assert policy.sandbox_config() is not None


def test_single_root_table() -> None:
    policy = CapabilityParser.from_string("root:\n  root: /srv/project\n  readonly: true\n")
    assert policy.root is not None
    assert policy.root.root == Path("/srv/project")
    assert policy.root.readonly is True


def test_from_file_sets_base_path(tmp_path: Path) -> None:
    policy_file = tmp_path / "conf" / "policy.yaml"
    policy_file.parent.mkdir()
    policy_file.write_text(FULL_POLICY, encoding="utf-8")
    policy = CapabilityParser.from_file(policy_file)
    assert policy.base_path == policy_file.parent.resolve()
    assert CapabilityParser.from_file(str(policy_file)).base_path == policy_file.parent.resolve()
    assert CapabilityParser.from_string(FULL_POLICY).base_path == Path.cwd()


def test_typo_key_names_line_and_field() -> None:
    error = parse_error("sandbox_tier: gvisor\nresource_limits:\n  max_memmory_mb: 128\n")
    assert error.line == 3
    assert error.field == "resource_limits.max_memmory_mb"
    assert "max_memmory_mb" in str(error)
    assert "Extra inputs are not permitted" in str(error)
    assert str(error).startswith("<string>, line 3, field 'resource_limits.max_memmory_mb'")


def test_typo_top_level_key() -> None:
    error = parse_error("sandbox_tier: gvisor\n\nnetwork_egres_rules: []\n")
    assert (error.line, error.field) == (3, "network_egres_rules")


def test_bad_value_deep_in_list() -> None:
    text = textwrap.dedent(
        """\
        network_egress_rules:
          - domain: api.openai.com
            ports: [443]
          - domain: ok.example.com
            ports:
              - 80
              - eighty
        """
    )
    error = parse_error(text)
    assert error.line == 7
    assert error.field == "network_egress_rules[1].ports[1]"
    assert "valid integer" in str(error)


def test_out_of_range_port_points_at_the_item() -> None:
    text = "network_egress_rules:\n  - domain: a.com\n    ports:\n      - 80\n      - 70000\n"
    error = parse_error(text)
    assert (error.line, error.field) == (5, "network_egress_rules[0].ports[1]")
    assert "less than or equal to 65535" in str(error)


def test_bad_root_name_is_an_error_of_the_model_itself() -> None:
    error = parse_error("paths:\n  'a/b': {root: x}\n")
    assert (error.line, error.field) == (1, "paths")
    assert "single word" in str(error)
    with pytest.raises(ValueError, match="single word"):
        CapabilityDeclaration(paths={"a/b": {"root": "x"}})


def test_numeric_pseudo_host_is_refused() -> None:
    error = parse_error("network_egress_rules:\n  - domain: '2130706433'\n")
    assert (error.line, error.field) == (2, "network_egress_rules[0].domain")


def test_bad_domain_in_second_rule() -> None:
    text = "network_egress_rules:\n  - domain: a.com\n  - domain: 'exa mple.com'\n"
    error = parse_error(text)
    assert (error.line, error.field) == (3, "network_egress_rules[1].domain")
    assert "must be a host name" in str(error)


def test_missing_required_field_points_at_parent() -> None:
    text = "network_egress_rules:\n  - domain: a.com\n  - ports: [443]\n"
    error = parse_error(text)
    assert (error.line, error.field) == (3, "network_egress_rules[1].domain")
    assert "Field required" in str(error)


def test_missing_root_in_paths_table() -> None:
    text = "paths:\n  data:\n    mode: ro\n"
    error = parse_error(text)
    assert (error.line, error.field) == (2, "paths.data.root")


def test_model_validator_error_points_at_section() -> None:
    text = "sandbox_tier: seccomp\nfilesystem_config:\n  mode: read_only\n  writable_paths: [/x]\n"
    error = parse_error(text)
    assert (error.line, error.field) == (2, "filesystem_config")
    assert "writable_paths must be empty" in str(error)


def test_root_and_paths_together_is_an_error() -> None:
    error = parse_error("# policy\nroot: {root: /a}\npaths: {a: {root: /b}}\n")
    assert error.line == 2
    assert error.field is None
    assert "at most one of 'root' or 'paths'" in str(error)


def test_bad_path_name_is_caught_at_parse_time() -> None:
    error = parse_error("sandbox_tier: seccomp\npaths:\n  '../up': {root: /tmp}\n")
    assert (error.line, error.field) == (2, "paths")
    assert "../up" in str(error)


def test_never_read_paths_are_read_and_normalised() -> None:
    text = ("filesystem_config:\n  readable_paths: null\n  never_read_paths:\n"
            "    - ~/.config/acme/\n    - /srv/keys//token\n    - '~'\n")
    config = CapabilityParser.from_string(text).filesystem_config
    assert config.never_read_paths == ["~/.config/acme", "/srv/keys/token", "~"]
    empty = CapabilityParser.from_string("filesystem_config:\n  never_read_paths:\n")
    assert empty.filesystem_config.never_read_paths == []
    assert CapabilityDeclaration().filesystem_config.never_read_paths == []


@pytest.mark.parametrize(
    ("value", "index", "message"),
    [
        ("~/.netrc", None, "never_read_paths must be a list of paths, like [~/.config/acme/token"),
        ("{a: /x}", None, "must be a list of paths, like [~/.config/acme/token, /srv/keys], "
                          "not a mapping"),
        ("[/srv/keys, keys/token]", 1, "never_read_paths entry 'keys/token' is relative; "
                                       "write an absolute path"),
        ("[~bob/.netrc]", 0, "names one user's home; write ~/... for the path beneath every "
                             "home folder, or the absolute path"),
        ("[42]", 0, "must be a path written as text, not a number (42); quote it"),
        ("[yes]", 0, "must be a path written as text, not true or false"),
        ("[[/a]]", 0, "must be a path written as text, not a list"),
        ("['']", 0, "is blank"),
        ("[/srv/../etc/shadow]", 0, "has a '..' part; write the path it means without it"),
        ("[/]", 0, "'/' would hide everything; list the stores themselves"),
    ],
)
def test_bad_never_read_paths_name_the_field_and_the_way_forward(
    value: str, index: int | None, message: str
) -> None:
    error = parse_error(f"filesystem_config:\n  mode: read_only\n  never_read_paths: {value}\n")
    field = "filesystem_config.never_read_paths" + ("" if index is None else f"[{index}]")
    assert (error.line, error.field) == (3, field)
    assert message in str(error)


def test_never_read_paths_are_checked_when_built_in_python_too() -> None:
    from sandbox_kernel_ext.policy.models import FilesystemConfig

    with pytest.raises(ValueError, match="must be a list of paths"):
        FilesystemConfig(never_read_paths="/srv/keys")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is relative"):
        FilesystemConfig(never_read_paths=["keys"])


def test_several_errors_report_the_first_line_and_mention_the_rest() -> None:
    text = "sandbox_tier: bogus\nresource_limits:\n  max_tokens: 0\n"
    error = parse_error(text)
    assert (error.line, error.field) == (1, "sandbox_tier")
    assert "line 3, resource_limits.max_tokens" in str(error)


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("sandbox_tier: gvisor\nsandbox_tier: seccomp\n", 2, "sandbox_tier"),
        ("resource_limits:\n  max_tokens: 1\n  max_tokens: 2\n", 3, "resource_limits.max_tokens"),
        (
            "network_egress_rules:\n  - domain: a.com\n  - domain: b.com\n    ports: []\n"
            "    domain: c.com\n",
            5,
            "network_egress_rules[1].domain",
        ),
        ("paths:\n  d: {root: /a, root: /b}\n", 2, "paths.d.root"),
    ],
)
def test_duplicate_keys(text: str, line: int, field: str) -> None:
    error = parse_error(text)
    assert (error.line, error.field) == (line, field)
    assert "duplicate key" in str(error)


def test_duplicate_key_names_first_line() -> None:
    error = parse_error("permissions: []\nsandbox_tier: gvisor\n\nsandbox_tier: gvisor\n")
    assert error.line == 4
    assert "first given on line 2" in str(error)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("sandbox_tier: gvisor\nresource_limits: [\n", 3),
        ("sandbox_tier: gvisor\nresource_limits:\n  max_memory_mb: 1\n bad: 2\n", 4),
        ("a: 'unterminated\n", 2),
        ("sandbox_tier: gvisor\n\tresource_limits: {}\n", 2),
        ("sandbox_tier: gvisor\n---\nsandbox_tier: seccomp\n", 2),
        ("sandbox_tier: gvisor\npermissions: [\x01]\n", 2),
    ],
)
def test_yaml_syntax_errors_give_line(text: str, line: int) -> None:
    error = parse_error(text)
    assert error.line == line
    assert "YAML syntax error" in str(error)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- sandbox_tier: gvisor\n", "must be a mapping"),
        ("just a string\n", "must be a mapping"),
        ("42\n", "must be a mapping"),
        ("1: gvisor\n", "quote it"),
        ("yes: 1\n", "read by YAML as a boolean"),
        ("null: 1\n", "quote it"),
        ("[a, b]: 1\n", "keys must be plain strings"),
        ("<<: {sandbox_tier: gvisor}\n", "merge keys"),
        ("sandbox_tier: !!binary Z3Zpc29y\n", "unsupported YAML tag"),
        ("sandbox_tier: !!python/name:os.system\n", "unsupported YAML tag"),
        ("permissions: !!set {a: null}\n", "unsupported YAML tag"),
        ("permissions: !custom x\n", "unsupported YAML tag"),
        ("a: &x [*x]\n", "alias refers to the value that contains it"),
        ("resource_limits: {max_tokens: " + "9" * 5000 + "}\n", "cannot read value"),
    ],
)
def test_odd_yaml_is_a_parse_error(text: str, message: str) -> None:
    assert message in str(parse_error(text))


def test_alias_bomb_is_stopped() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    error = parse_error("\n".join(lines) + "\n")
    assert "aliases expanding too far" in str(error)


def test_plain_aliases_still_work() -> None:
    text = "env_allowlist: &vars [PATH, HOME]\npermissions: *vars\n"
    policy = CapabilityParser.from_string(text)
    assert policy.permissions == ["PATH", "HOME"]


def test_deep_nesting_is_a_parse_error() -> None:
    with pytest.raises(CapabilityParseError, match="nested too deeply"):
        CapabilityParser.from_string("[" * 5000 + "]" * 5000)
    indented = "a:\n" + "".join(" " * depth + "- \n" for depth in range(1, 200))
    with pytest.raises(CapabilityParseError, match="nested deeper than 64 levels"):
        CapabilityParser.from_string(indented)


@pytest.mark.parametrize("value", [None, 42, b"sandbox_tier: gvisor"])
def test_non_string_input(value: object) -> None:
    with pytest.raises(CapabilityParseError, match="must be str"):
        CapabilityParser.from_string(value)  # type: ignore[arg-type]


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "policy.yaml"
    with pytest.raises(CapabilityParseError) as info:
        CapabilityParser.from_file(missing)
    assert info.value.source == str(missing)
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


def test_directory_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(CapabilityParseError, match="cannot read policy file"):
        CapabilityParser.from_file(tmp_path)
    binary = tmp_path / "policy.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CapabilityParseError, match="not UTF-8"):
        CapabilityParser.from_file(binary)


def test_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("sandbox_tier: gvisor\nresource_limits:\n  max_memory_mb: -1\n")
    with pytest.raises(CapabilityParseError) as info:
        CapabilityParser.from_file(policy_file)
    assert (info.value.source, info.value.line) == (str(policy_file), 3)
    expected = f"{policy_file}, line 3, field 'resource_limits.max_memory_mb'"
    assert str(info.value).startswith(expected)


def test_unexpected_internal_errors_are_still_parse_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise TypeError("surprise")

    monkeypatch.setattr(CapabilityDeclaration, "model_validate", explode)
    with pytest.raises(CapabilityParseError, match="TypeError: surprise"):
        CapabilityParser.from_string("sandbox_tier: gvisor\n")


def test_source_is_used_in_messages() -> None:
    with pytest.raises(CapabilityParseError, match=r"^cell 3, line 1, field 'sandbox_tier'"):
        CapabilityParser.from_string("sandbox_tier: nope\n", source="cell 3")


# --- fuzzing: nothing but CapabilityParseError may escape --------------------------------

FIELD_NAMES = sorted(
    {
        *CapabilityDeclaration.model_fields,
        "domain", "ports", "rate_limit_per_min", "private_networks",
        "mode", "writable_paths", "readable_paths", "never_read_paths",
        "max_memory_mb", "max_cpu_seconds", "max_cost_usd", "max_tokens",
        "root", "suffixes", "max_file_bytes", "write_approval", "read_approval", "readonly",
        "max_read_bytes", "backend", "deny_symlinks",
    }
)  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["gvisor", "read_write", "rw", "ro", "*.example.com", "/tmp", ".txt", "store"]),
    st.text(max_size=20),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8))
yamlish = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=25,
)
policies = st.dictionaries(st.sampled_from(FIELD_NAMES), yamlish, max_size=6)


def parse_or_parse_error(text: str) -> None:
    try:
        result = CapabilityParser.from_string(text)
    except CapabilityParseError:
        return
    assert isinstance(result, CapabilityDeclaration)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_arbitrary_text(text: str) -> None:
    parse_or_parse_error(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable + "&*!|>-[]{}:,'\"#%@`?~", max_size=200))
def test_fuzz_yaml_punctuation(text: str) -> None:
    parse_or_parse_error(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(policies, yamlish), st.sampled_from([True, False]))
def test_fuzz_yaml_structures(data: object, flow: bool) -> None:
    parse_or_parse_error(yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies)
def test_fuzz_valid_data_round_trips_or_names_a_line(data: dict[str, object]) -> None:
    text = yaml.safe_dump(data, default_flow_style=False)
    try:
        CapabilityParser.from_string(text)
    except CapabilityParseError as error:
        assert error.line is not None and 1 <= error.line <= text.count("\n") + 1
