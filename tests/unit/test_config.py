import pytest

from proxy.config import Settings, build_parser, load_settings


def test_defaults_when_nothing_is_given():
    assert load_settings([], {}) == Settings()


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        ([], {"PROXY_PORT": "9000"}, "port", 9000),
        (["--port", "9001"], {"PROXY_PORT": "9000"}, "port", 9001),  # the flag wins
        ([], {"UPSTREAM_URL": "http://llama:8081"}, "upstream_url", "http://llama:8081"),
        ([], {"PROXY_DEADLINE": "12.5"}, "decision_deadline_s", 12.5),
        ([], {"PROXY_INVOCATIONS_TIMEOUT": "3600"}, "invocations_timeout_s", 3600.0),
        ([], {"PROXY_QUESTION_FANOUT": "0"}, "question_fanout", 0),
        ([], {"PROXY_API_KEY": ""}, "api_key", None),  # empty means unset
        (["--max-body-bytes", "2048"], {}, "max_body_bytes", 2048),
        ([], {"PROXY_RELAY_MAX_TOKENS": "0"}, "relay_max_tokens", 0),  # no cap
        ([], {}, "relay_max_tokens", 2048),
    ],
)
def test_flags_then_environment_then_defaults(argv, env, field, expected):
    assert getattr(load_settings(argv, env), field) == expected


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--port", "0"], {}),
        ([], {"PROXY_REQUEST_TIMEOUT": "-1"}),
        ([], {"PROXY_MAX_BODY_BYTES": "10"}),
        (["--n-probs", "0"], {}),
        ([], {"PROXY_MAX_ACTIVE": "0"}),
        (["--relay-max-tokens", "-1"], {}),
    ],
)
def test_impossible_settings_are_refused(argv, env):
    with pytest.raises(ValueError):
        load_settings(argv, env)


def test_help_names_every_environment_variable():
    text = build_parser().format_help()
    for env in (
        "PROXY_PORT",
        "UPSTREAM_URL",
        "PROXY_API_KEY",
        "PROXY_DEADLINE",
        "PROXY_MAX_QUEUED",
    ):
        assert env in text


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--workers", "2"], {}, "--workers"),
        ([], {"PROXY_WORKERS": "4"}, "PROXY_WORKERS"),
        (["--workers", "3"], {"PROXY_WORKERS": "1"}, "--workers"),  # the flag wins
    ],
)
def test_a_removed_setting_asking_for_more_stops_the_start_naming_it(argv, env, named, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_settings(argv, env)
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert f"{named} was removed" in said and "replicas" in said


@pytest.mark.parametrize(("argv", "env"), [(["--workers", "1"], {}), ([], {"PROXY_WORKERS": "1"})])
def test_a_removed_setting_at_its_old_default_is_said_and_ignored(argv, env, caplog):
    assert load_settings(argv, env) == Settings()
    assert "was removed and is ignored" in caplog.text


def test_a_removed_setting_is_not_in_the_help():
    assert "workers" not in build_parser().format_help()
