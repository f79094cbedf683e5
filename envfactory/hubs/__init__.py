"""EnvFactory environments for other RL stacks: OpenEnv and verifiers packages (`envfactory envs export`)."""
