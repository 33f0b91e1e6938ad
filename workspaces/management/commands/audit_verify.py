"""``manage.py audit_verify [--org SLUG]``. Here rather than in ``audit/``: it finds an
organisation by its slug, and audit sits below workspaces."""

from django.core.management.base import BaseCommand, CommandError

from audit.chain import org_chain, verify_chain
from audit.models import AuditChainHead
from workspaces.models import Organization


class Command(BaseCommand):
    help = "Recompute the audit hash chain(s); exit 1 naming the first broken link."

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
            result = verify_chain(chain)
            if result.ok:
                self.stdout.write(f"{chain}: ok ({result.checked} events)")
            else:
                broken += 1
                link = result.first_broken
                self.stdout.write(
                    f"{chain}: BROKEN at event id={link['id']} seq={link['seq']} "
                    f"({link['action']}): {link['reason']}"
                )
        if broken:
            raise CommandError(f"{broken} broken chain(s)")
