#!/bin/bash
# Reference solution: the same interactive rebase with scripted editors (the todo list's last two picks become
# squashes; the combined message is replaced by the one asked for).
set -euo pipefail
cd /app/repo
git config user.name Dev
git config user.email dev@example.com
GIT_SEQUENCE_EDITOR="sed -i -e '2,3s/^pick/squash/'" GIT_EDITOR="printf 'Add number parsing\n' >" \
    git rebase -i HEAD~3
git log --oneline
