"""Lightning and Transformers on Ray: ormas-monitor's own callbacks, wired to the ray-ormas record
(mirroring `ormas_monitor.integrations`). Run inside a worker, added by worker/adoption.py."""
