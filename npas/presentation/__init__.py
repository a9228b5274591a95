"""Presentation: the command line (`cli`) and the HTML dashboards (`dashboard`). Only this layer prints."""
