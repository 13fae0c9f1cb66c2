

@pytest.mark.torchrun
def test_verify_resume_on_the_hub_says_the_build_was_not_run(hub_module: HubEndpoint, run_on_hub: Path) -> None:
    rc, out, err = _cli(hub_module, "verify-resume", f"hf://{RUN_REPO}", "--json")
    assert rc == 0, err
    build = {c["name"]: c for c in json.loads(out)["checks"]}["policy-builds"]
    assert build["message"].startswith("not run: the checkpoint is on the Hub")
