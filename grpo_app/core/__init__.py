"""The ground floor: what every other layer reads and nothing here imports from above.

Settings (`config`), where problems come from (`data`) and how they are asked (`prompts`), the one answer
reader (`answers`) and the rewards built on it (`rewards`), loading models (`models`), crash-safe files
(`fileio`), a run's folder on disk (`run_folder`), the machine (`system`, `env`) and the processes of a
data-parallel job (`distributed`).
"""
