"""The code shipped to the nodes: the nodelet and every module it imports, stdlib only and
Python 3.6 (``remote/shipping.py`` sends them in one payload; nothing is installed on a
node). Nothing here imports outside this folder, and nothing outside it is shipped
(``tests/unit/test_architecture.py``). The head imports the parsers too, to read what the
nodes send.

Nothing is imported here: the nodes load these modules one by one, without the head's.
"""
