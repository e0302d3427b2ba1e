"""Developer tools that ship with the repository but not in the wheel: the documentation's
generators and checks (``python -m tools.docs``) and the dump of every sweep's composed runs
(``python -m tools.sweep_configs``)."""
