module banlieue.test/pause

go 1.22
