from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.adapters.services import base_model_register
from apps.common.exceptions import ApplicationError


class Command(BaseCommand):
    help = "Register (or update) a base model: the name vLLM serves it under and its local directory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="vLLM's served model name for it")
        parser.add_argument("path", help="local Hugging Face model directory")
        parser.add_argument(
            "--family", help="FIM format (qwen, starcoder, codellama, deepseek, plain); detected if omitted"
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="point the name at other weights even though adapter versions were trained on its current ones",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            base = base_model_register(
                name=options["name"], path=options["path"], family=options["family"], force=options["force"]
            )
        except ApplicationError as exc:
            forcing = isinstance(exc.details, dict) and exc.details.get("versions")
            raise CommandError(exc.message + (". To repoint them anyway: --force" if forcing else "")) from exc
        self.stdout.write(f"base model {base.name}: {base.path} ({base.family})")
        self.stdout.write(f"  source: {base.source}")
        self.stdout.write(f"  fingerprint: {base.fingerprint}")
