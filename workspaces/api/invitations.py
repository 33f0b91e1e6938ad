"""Invitations into an organisation (``workspaces/invitations.py``): org admins invite an
address; whoever holds the token accepts it."""

from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from config.schema import ErrorSerializer
from config.strict import StrictSerializer
from config.throttles import LoginIPThrottle
from workspaces import invitations, roles
from workspaces.models import Invitation, OrgRole

from .idempotency import IDEMPOTENCY_KEY, idempotent
from .tenancy import TenantViewSet


class InvitationCreateInput(StrictSerializer):
    email = serializers.EmailField()
    org_role = serializers.ChoiceField(choices=OrgRole.choices, default=OrgRole.MEMBER)


class InvitationOutput(serializers.ModelSerializer):
    invited_by = serializers.SlugRelatedField(slug_field="email", read_only=True, allow_null=True)
    state = serializers.SerializerMethodField()

    class Meta:
        model = Invitation
        fields = ["id", "email", "org_role", "state", "invited_by", "created_at", "expires_at"]

    def get_state(self, invitation) -> str:
        if invitation.accepted_at:
            return "accepted"
        if invitation.revoked_at:
            return "revoked"
        return "expired" if invitation.expires_at <= timezone.now() else "pending"


class InvitationCreatedOutput(InvitationOutput):
    token = serializers.CharField(
        help_text="Shown once (and mailed to the address): the invitee accepts with it"
    )

    class Meta(InvitationOutput.Meta):
        fields = [*InvitationOutput.Meta.fields, "token"]


class InvitationAcceptInput(StrictSerializer):
    token = serializers.CharField(max_length=100)
    password = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        trim_whitespace=False,
        max_length=256,
        help_text="The existing account's password, or the new account's (not needed when "
        "signed in as the invited account)",
    )
    full_name = serializers.CharField(required=False, allow_blank=True, max_length=200)


class MembershipOutput(serializers.Serializer):
    organization = serializers.CharField(source="organization.slug")
    email = serializers.EmailField(source="user.email")
    org_role = serializers.CharField(source="role")


class InvitationViewSet(TenantViewSet):
    """Invitations of an organisation (org owners and admins)."""

    serializer_class = InvitationOutput
    queryset = Invitation.objects.none()
    organization_field = "organization"
    not_found_message = "No such invitation."
    permission_map = {
        "list": roles.ORG_MANAGE_USERS,
        "create": roles.ORG_MANAGE_USERS,
        "destroy": roles.ORG_MANAGE_USERS,
    }

    def base_queryset(self):
        return Invitation.objects.select_related("invited_by")

    @extend_schema(operation_id="invitations_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(InvitationOutput(page, many=True).data)

    @extend_schema(
        operation_id="invitations_create",
        parameters=[IDEMPOTENCY_KEY],
        request=InvitationCreateInput,
        responses={201: InvitationCreatedOutput},
        examples=[
            OpenApiExample(
                "A developer",
                value={"email": "dev@acme.test", "org_role": "member"},
                request_only=True,
            )
        ],
        description="The answer is the same whether the address has an account or not.",
    )
    @idempotent
    def create(self, request, org=None):
        data = InvitationCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        invitation, token = invitations.invitation_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        invitation.token = token
        return Response(InvitationCreatedOutput(invitation).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="invitation_revoke", responses={204: None})
    def destroy(self, request, org=None, pk=None):
        invitations.invitation_revoke(actor=self.actor, invitation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptView(APIView):
    """Accept an invitation: signed in as the invited account, or with its password (an
    existing account), or with a new password (a new account)."""

    permission_classes = [AllowAny]
    throttle_classes = [LoginIPThrottle]  # it checks a password, like signing in

    @extend_schema(
        operation_id="invitation_accept",
        request=InvitationAcceptInput,
        responses={
            200: MembershipOutput,
            403: OpenApiResponse(ErrorSerializer, description="Signed in as another account"),
        },
    )
    def post(self, request):
        data = InvitationAcceptInput(data=request.data)
        data.is_valid(raise_exception=True)
        user = request.user if getattr(request.user, "is_authenticated", False) else None
        membership = invitations.invitation_accept(user=user, **data.validated_data)
        return Response(MembershipOutput(membership).data)
