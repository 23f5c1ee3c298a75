"""``kvlink-rag router``: bad arguments are one line and a non-zero exit, before anything starts."""

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_a_router_without_replicas_or_events_url_or_with_an_unknown_policy_refuses_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLINK_RAG_HOME", str(tmp_path))
    for args, says in ((["router"], "the router needs replicas"),
                       (["router", "--replica", "http://127.0.0.1:1", "--policy", "random"], "--policy 'random'")):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and says in r.output and "Traceback" not in r.output, r.output
