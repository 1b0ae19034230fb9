from turnkeep.bench.restart_phases import PHASES, cpu_by_role, phases_of


def test_phases_are_seconds_from_the_command_whichever_clock_each_came_from():
    began = 1000.0
    startup = {"process_start_unix_s": 1000.5, "seconds": {"run_started": 1.0, "ray": 4.0, "engines": 19.5,
                                                           "reattached": 2.0}}
    events = [{"event": "restored", "t": 1021.0}, {"event": "step_trained", "t": 1022.25},
              {"event": "turn_committed", "t": 1024.0}, {"event": "step_trained", "t": 1023.0}]
    phases = phases_of(began, startup, events)
    assert list(phases) == list(PHASES)
    assert phases["process"] == 0.5 and phases["run_started"] == 1.5
    assert phases["ray"] == 4.5 and phases["engines"] == 20.0
    assert phases["first_step"] == 22.25 and phases["first_turn"] == 24.0
    assert phases["trainer"] is None  # not marked (a re-attach); a mark of no phase is left out
    assert "reattached" not in phases


def test_a_restart_without_its_startup_line_still_has_its_first_step_and_turn():
    phases = phases_of(0.0, None, [{"event": "turn_committed", "t": 9.0}])
    assert phases["first_turn"] == 9.0 and phases["first_step"] is None and phases["ray"] is None


def test_cpu_seconds_are_summed_by_kind_of_process():
    totals = cpu_by_role([
        ("ray::TrainerActor.train_step", 8.0), ("ray::TrainerRank", 1.0), ("ray::PolicyActor", 7.5),
        ("VLLM::EngineCore", 2.0), ("/venv/bin/python -B -c from multiprocessing.forkserver import main", 6.5),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x", 0.5),
        ("/venv/bin/python -m ray.scripts.scripts start --head", 1.0), ("ray::DashboardAgent", 0.25),
        ("/venv/bin/temporal server start-dev --db-filename x", 0.75), ("/venv/bin/python -m cli.main run", 2.0),
        ("ray::EnvServerActor", 1.0), ("sleep 100", 0.5),
    ])
    assert totals == {"trainer": 9.0, "policy front end": 7.5, "engine core": 2.0, "engine forkserver": 6.5,
                      "Ray": 1.75, "Temporal": 0.75, "controller": 2.0, "environment server": 1.0, "other": 0.5}
