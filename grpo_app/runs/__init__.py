"""Running training jobs for a server or the CLI: the one job of a server and its live store (`manager`),
the child process it trains in (`train_child`), what a page sees of a job (`monitor`), the background
queue for scoring (`job_queue`) and answers across a run's steps (`step_history`). A run's folder on disk
is `core.run_folder`.
"""
