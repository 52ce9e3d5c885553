"""Integrations with the frameworks syncjobs is made for; each imports its framework only when used."""
