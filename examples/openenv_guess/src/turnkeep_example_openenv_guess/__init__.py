"""An OpenEnv environment small enough to train the made-up tiny model on 2 cores: guess the seeded number."""
