"""The driver: `RayOrmasTrainer` and what it checks before Ray starts (options, storage paths,
capacity), the fit it runs, and what `fit()` returns. Runs in the user's process (or the
`ray job submit` entrypoint); imports the head and worker sides to hand them their parts."""
