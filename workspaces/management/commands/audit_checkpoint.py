"""``manage.py audit_checkpoint [--org SLUG]``: verify each chain since its last checkpoint and
sign its head now, as the periodic task does (audit/signing.py). Here rather than in ``audit/``:
it finds an organisation by its slug, and audit sits below workspaces."""

from django.core.management.base import BaseCommand, CommandError

from audit import services
from audit.chain import org_chain
from audit.models import AuditChainHead
from workspaces.models import Organization


class Command(BaseCommand):
    help = "Sign a checkpoint of the audit chain(s); exit 1 naming a chain that does not verify."

    def add_arguments(self, parser):
        parser.add_argument("--org", help="only this organisation's chain (slug)")

    def handle(self, *args, org=None, **options):
        if org:
            found = Organization.objects.filter(slug=org).first()
            if found is None:
                raise CommandError(f"no organisation {org!r}")
            chains = [org_chain(found.pk)]
        else:
            chains = list(AuditChainHead.objects.order_by("chain").values_list("chain", flat=True))
        broken = 0
        for chain in chains:
            try:
                checkpoint = services.checkpoint_create(chain=chain)
            except services.AuditChainBroken as exc:
                broken += 1
                link = exc.result.first_broken or {}
                self.stdout.write(
                    f"{chain}: BROKEN at event id={link.get('id')} seq={link.get('seq')}: "
                    f"{link.get('reason')} (not signed)"
                )
                continue
            if checkpoint is None:
                self.stdout.write(f"{chain}: unchanged since the last checkpoint")
            else:
                self.stdout.write(
                    f"{chain}: checkpoint at seq {checkpoint.count} "
                    f"(event id={checkpoint.last_event_id}, hash {checkpoint.head_hash[:16]}…)"
                )
        if broken:
            raise CommandError(f"{broken} broken chain(s)")
