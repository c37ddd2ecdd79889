# ServingFailure moves from the serving app to interactions: state only, the table stays.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('adapters', '0003_base_model_source_fingerprint'),
        ('experiments', '0001_initial'),
        ('interactions', '0005_conversations'),
        ('serving', '0002_servingfailure_experiment'),
        ('tenants', '0003_default_opt_in_and_experiment_modes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ServingFailure',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('experiment_arm', models.CharField(blank=True, max_length=64)),
                        ('end_user_id', models.CharField(blank=True, max_length=200)),
                        ('kind', models.CharField(help_text='the error code: vllm_unavailable, vllm_error, ...', max_length=32)),
                        ('message', models.TextField(blank=True)),
                        ('streamed', models.BooleanField(default=False, help_text='the failure came after the stream had started')),
                        ('occurred_at', models.DateTimeField()),
                        ('latency_ms', models.FloatField(blank=True, null=True)),
                        ('adapter', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='adapters.adapter')),
                        ('adapter_version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='adapters.adapterversion')),
                        ('experiment', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='experiments.experiment')),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant')),
                    ],
                    options={
                        'db_table': 'serving_servingfailure',
                        'indexes': [
                            models.Index(fields=['tenant', 'occurred_at'], name='serving_ser_tenant__803cf5_idx'),
                            models.Index(fields=['experiment', 'end_user_id'], name='serving_ser_experim_7843ec_idx'),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
