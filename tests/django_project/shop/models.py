from django.db import models


class Order(models.Model):
    number = models.CharField(max_length=20, unique=True)
    confirmed = models.BooleanField(default=False)

    class Meta:
        app_label = "shop"
