from django.db import transaction
from django.http import HttpRequest, JsonResponse

from syncjobs.contrib.django import dispatch

from .jobs import ConfirmOrder
from .models import Order


def place_order(request: HttpRequest) -> JsonResponse:
    number, database = request.POST["number"], request.POST["database"]
    with transaction.atomic(using=database):
        Order.objects.using(database).create(number=number)
        job_id = dispatch(ConfirmOrder(number=number, database=database), using=database)
        if request.POST.get("fail"):
            raise RuntimeError("the payment failed after the order was saved")
    return JsonResponse({"job": job_id})
