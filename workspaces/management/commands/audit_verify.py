"""``manage.py audit_verify [--org SLUG] [--since-checkpoint]``. Here rather than in ``audit/``:
it finds an organisation by its slug, and audit sits below workspaces.

Either way each chain is checked against its signed checkpoints (audit/signing.py); with
``--since-checkpoint`` only the events after the latest one are recomputed, which is what a
frequent run needs, and a full run now and then covers the rest."""

from django.core.management.base import BaseCommand, CommandError

from audit.chain import org_chain, verify_chain
from audit.models import AuditChainHead
from workspaces.models import Organization


class Command(BaseCommand):
    help = "Recompute the audit hash chain(s); exit 1 naming the first broken link."

    def add_arguments(self, parser):
        parser.add_argument("--org", help="only this organisation's chain (slug)")
        parser.add_argument(
            "--since-checkpoint",
            action="store_true",
            help="check the latest signed checkpoint, then recompute only the events after it",
        )

    def handle(self, *args, org=None, since_checkpoint=False, **options):
        if org:
            found = Organization.objects.filter(slug=org).first()
            if found is None:
                raise CommandError(f"no organisation {org!r}")
            chains = [org_chain(found.pk)]
        else:
            chains = list(AuditChainHead.objects.order_by("chain").values_list("chain", flat=True))
        broken = 0
        for chain in chains:
            result = verify_chain(chain, since_checkpoint=since_checkpoint)
            if result.ok:
                since = (
                    f" after the checkpoint at seq {result.since_seq}" if result.since_seq else ""
                )
                self.stdout.write(
                    f"{chain}: ok ({result.checked} events{since}, "
                    f"{result.checkpoints} signed checkpoint(s) match)"
                )
            else:
                broken += 1
                link = result.first_broken
                self.stdout.write(
                    f"{chain}: BROKEN at event id={link['id']} seq={link['seq']} "
                    f"({link['action']}): {link['reason']}"
                )
        if broken:
            raise CommandError(f"{broken} broken chain(s)")
