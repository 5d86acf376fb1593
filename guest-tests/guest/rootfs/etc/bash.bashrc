# bash settings of the p2plab guest (interactive shells)
[ -z "${PS1:-}" ] && return
PS1='\u@\h:\w\$ '
HISTFILE=/tmp/.bash_history
alias ls='ls --color=auto' ll='ls -l' la='ls -la'
