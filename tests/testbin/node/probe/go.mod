module banlieue.io/testbin/node/probe

go 1.22
