"""Joins the two branches of 0008: persistence reports (0009_persistence_reports) and the rollups
with their triggers and the served-at index (0009_rollups to 0011). Neither touches the other's
tables."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0009_persistence_reports"),
        ("interactions", "0011_interaction_served_index"),
    ]

    operations = []
