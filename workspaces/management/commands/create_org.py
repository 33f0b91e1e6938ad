from django.core.management.base import BaseCommand, CommandError

from audit.context import Actor
from config.errors import DomainError
from workspaces import identity, services


class Command(BaseCommand):
    help = (
        "Create an organisation and its owner; print an API token for the owner as the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--owner", required=True, help="the owner's email")
        parser.add_argument("--password", help="the owner's password (new users only)")
        parser.add_argument("--name", default="", help="display name (default: the slug)")

    def handle(self, *args, slug, owner, password, name, **options):
        actor = Actor.system("create_org")
        try:
            org, user = services.org_create(
                actor=actor, slug=slug, name=name, owner_email=owner, owner_password=password
            )
            _, secret = identity.token_create(actor=actor, user=user, name="create_org")
        except DomainError as exc:
            raise CommandError(f"{exc.detail} {exc.errors or ''}".strip()) from exc
        self.stderr.write(f"created organisation {org.slug} with owner {user.email}")
        self.stdout.write(secret)
