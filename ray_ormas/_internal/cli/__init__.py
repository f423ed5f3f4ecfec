"""The command line, `ray-ormas` (train, demo, report, export, mlflow-sync): runs on the driver.
Nothing imports it; its entry points are the `ray-ormas` script and `python -m ray_ormas`."""
