"""The records every stage shares: tasks, turns, conversations, episodes, verification, the run folder."""
