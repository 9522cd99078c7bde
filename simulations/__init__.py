"""Fleet files and the Ray fleet runner. Built in a later issue."""
