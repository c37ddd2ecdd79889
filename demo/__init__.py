"""The demo's driver: the learning loop as tenants see it, over the API alone (``demo/loop.py``,
which ``make demo`` runs through ``platform/demo.sh``), and its report (``demo/report.py``).

Python that drives the platform from outside, as a tenant's code would; the ops scripts that start
the platform stay in ``platform/``, which holds no Python package.
"""
